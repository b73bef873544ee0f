#!/usr/bin/python3
"""The GPU trains as the CPU does: runs one script for STEPS steps with `--device cpu` and
with `--device cuda` and compares the loss of every step and the validation loss.

The two devices sum in different orders, so the losses agree to fp32 rounding grown over
the steps, not bit for bit: the tolerance is relative, 1e-4 by default. Without a GPU the
test is skipped (exit 77).

With --np N the GPU run has N ranks (mpirun; data parallelism over NCCL, or over MPI
staged through the host where ranks share a GPU) and the CPU run one.

The GPU run's memory after the first step must be the device's (planned against measured
on the GPU), and is printed for the record.

usage: device_equivalence.py EPL WORKDIR SCRIPT [--steps 20] [--tol 1e-4] [--np 1]
                             [--set KEY=VALUE ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parallel"))
from equivalence import compare, require_training, run  # noqa: E402


def no_gpu(stderr):
    return "no GPU" in stderr or "built without CUDA" in stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("epl")
    ap.add_argument("work")
    ap.add_argument("script")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    a = ap.parse_args()
    if a.np > 1:  # mpirun as root, with more ranks than cores
        for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                  "OMPI_MCA_rmaps_base_oversubscribe"):
            os.environ.setdefault(k, "1")
    os.makedirs(a.work, exist_ok=True)
    script = os.path.abspath(a.script)
    gpu, gpu_eval, out, _ = run(a.epl, a.work, script, "cuda", ["--device", "cuda", "-np", str(a.np)], a.steps,
                                a.sets, skip=no_gpu)
    print(out.splitlines()[0] if out else "")
    # The device's own memory beside the plan (Device::peakBytes), not the host's.
    memory = [line for line in out.splitlines() if line.startswith("memory after the first step")]
    print(memory[0] if memory else "no memory line after the first step")
    if not memory or "the device memory" not in memory[0]:
        sys.exit("FAIL: the GPU run did not measure its device's memory after the first step")
    # Two threads: tools/gpu_check.sh runs a dozen of these side by side (any thread count
    # gives the CPU's same bits).
    cpu, cpu_eval, _, _ = run(a.epl, a.work, script, "cpu", ["--device", "cpu", "--threads", "2"],
                              a.steps, a.sets)
    worst = compare(cpu, cpu_eval, gpu, gpu_eval, "cpu", "cuda")
    print(f"worst relative difference {worst:.2e} (tolerance {a.tol:g})")
    if worst > a.tol:
        sys.exit("FAIL: the GPU's losses differ from the CPU's")
    require_training(cpu)


if __name__ == "__main__":
    main()
