#!/usr/bin/python3
"""The GPU trains as the CPU does: runs one script for STEPS steps with `--device cpu` and
with `--device cuda` and compares the loss of every step and the validation loss.

The two devices sum in different orders, so the losses agree to fp32 rounding grown over
the steps, not bit for bit: the tolerance is relative, 1e-4 by default. Without a GPU the
test is skipped (exit 77).

usage: device_equivalence.py EPL WORKDIR SCRIPT [--steps 20] [--tol 1e-4] [--set KEY=VALUE ...]
"""
import argparse
import json
import os
import subprocess
import sys

SKIP = 77


def run(epl, work, script, device, steps, sets):
    metrics = os.path.join(work, f"{device}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [epl, "run", script, "--device", device, "--steps", str(steps), "--metrics", metrics]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
    with open(os.path.join(work, f"{device}.out"), "w") as f:
        f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        if device == "cuda" and ("no GPU" in out.stderr or
                                 "built without CUDA" in out.stderr):
            print(f"skipped: {out.stderr.strip()}")
            sys.exit(SKIP)
        sys.exit(f"FAIL: {' '.join(cmd)} exited {out.returncode}\n{out.stdout}\n{out.stderr}")
    print(out.stdout.splitlines()[0] if out.stdout else "")
    losses, evals = [], []
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            (evals if "eval_loss" in rec else losses).append(
                rec["eval_loss"] if "eval_loss" in rec else rec["loss"])
    if len(losses) != steps:
        sys.exit(f"FAIL: --device {device} logged {len(losses)} steps, expected {steps}")
    return losses, evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("epl")
    ap.add_argument("work")
    ap.add_argument("script")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    script = os.path.abspath(a.script)
    gpu, gpu_eval = run(a.epl, a.work, script, "cuda", a.steps, a.sets)
    cpu, cpu_eval = run(a.epl, a.work, script, "cpu", a.steps, a.sets)
    worst = 0.0
    for i, (x, y) in enumerate(zip(cpu, gpu)):
        rel = abs(x - y) / max(abs(x), 1e-30)
        worst = max(worst, rel)
        print(f"step {i + 1:2}: cpu {x:.9f}  cuda {y:.9f}  rel {rel:.2e}")
    if len(cpu_eval) != len(gpu_eval):
        sys.exit(f"FAIL: cuda ran {len(gpu_eval)} evaluations, cpu {len(cpu_eval)}")
    for x, y in zip(cpu_eval, gpu_eval):
        rel = abs(x - y) / max(abs(x), 1e-30)
        worst = max(worst, rel)
        print(f"validation: cpu {x:.9f}  cuda {y:.9f}  rel {rel:.2e}")
    print(f"worst relative difference {worst:.2e} (tolerance {a.tol:g})")
    if worst > a.tol:
        sys.exit("FAIL: the GPU's losses differ from the CPU's")
    if abs(cpu[0] - cpu[-1]) < 0.05 * abs(cpu[0]):
        sys.exit("FAIL: the loss hardly changed; the comparison is not meaningful")


if __name__ == "__main__":
    main()
