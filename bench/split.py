#!/usr/bin/python3
"""Tensor parallelism (`split`): the step time of a split char-GPT against one device on the
same cores, and the share of the split run's time spent in its communication.

The model is bench/split_gpt.epl: four blocks, the head and the loss split `w` ways
(heads, mlp hidden width, vocabulary-parallel loss), the embedding data-parallel.

1. Step time (median `step_seconds` of the metrics after 2 warm-up steps, no trace):
   -np w with 1 thread a rank, against -np 1 with w threads (the same cores) and -np 1
   with 1 thread. Target: split w within 1.15x of -np 1 with w threads.
   And -np w with `sequence_parallel = true`: its step time, and the activation memory of
   a rank in both runs (the run's memory plan).
2. Communication share: a traced -np w run (`--trace`; each instruction synchronizes),
   the time in the split regions' collectives (the communication track) over the time
   of every instruction, per rank, steps 2 on.

usage: bench/split.py [--epl build/epl] [--width 2] [--steps 10] [--batch 32] [--keep DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
ENV.setdefault("EPL_STDLIB", os.path.join(HERE, "..", "stdlib"))
WARMUP = 2
TARGET = 1.15


def script(work, width):
    """The benchmark's model with split width `width`."""
    text = open(os.path.join(HERE, "split_gpt.epl")).read()
    text = re.sub(r"\bw = 2\b", f"w = {width}", text)
    path = os.path.join(work, f"split_gpt{width}.epl")
    with open(path, "w") as f:
        f.write(text)
    return path


def run(args, work, path, np, threads, trace=None, settings=()):
    """Runs the script; returns the step_seconds of every step and the output."""
    metrics = os.path.join(work, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.epl, "run", path, "-np", str(np), "--threads", str(threads), "--steps",
           str(args.steps), "--metrics", metrics, "--set", f"train.batch={args.batch}"]
    if trace:
        cmd += ["--trace", trace]
    for s in settings:
        cmd += ["--set", s]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, cwd=work)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    rows = [json.loads(l) for l in open(metrics) if "step_seconds" in l]
    return [row["step_seconds"] for row in rows], r.stdout


def activations(output):
    """The activation memory of a rank in the run's memory plan, as printed."""
    m = re.search(r"memory plan [^(]*\(activations ([^,]+),", output)
    return m.group(1) if m else "?"


def comm_share(trace):
    """Per rank: communication-track time over all instruction time, steps 2 on."""
    events = [e for e in json.load(open(trace))["traceEvents"]
              if e.get("ph") == "X" and e["args"].get("step", 0) >= 2]
    shares = []
    for pid in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == pid]
        total = sum(e["dur"] for e in mine)
        comm = sum(e["dur"] for e in mine if e["tid"] == 1)
        shares.append(comm / total if total else 0)
    return shares


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epl", default=os.path.join(HERE, "..", "build", "epl"))
    ap.add_argument("--width", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--keep", metavar="DIR", help="keep the scripts and the trace in DIR")
    args = ap.parse_args()
    args.epl = os.path.abspath(args.epl)
    if args.steps <= WARMUP:
        ap.error(f"--steps must be above the {WARMUP} warm-up steps")
    w = args.width
    cores = len(os.sched_getaffinity(0))
    print(f"split of bench/split_gpt.epl (char-GPT, d 256, 4 blocks, seq 128, batch "
          f"{args.batch}), width {w}, {cores} cores; median step of {args.steps - WARMUP} "
          f"after {WARMUP} warm-up\n")
    med = lambda times: statistics.median(times[WARMUP:])
    with tempfile.TemporaryDirectory() as scratch:
        work = os.path.abspath(args.keep) if args.keep else scratch
        os.makedirs(work, exist_ok=True)
        path = script(work, w)
        split, split_out = run(args, work, path, w, 1)
        seq, seq_out = run(args, work, path, w, 1, settings=["policy.sequence_parallel=true"])
        same, _ = run(args, work, path, 1, w)
        one, _ = run(args, work, path, 1, 1)
        split_s, seq_s, same_s, one_s = med(split), med(seq), med(same), med(one)
        ratio = split_s / same_s
        print("1. step time")
        rows = [(f"-np {w}, 1 thread a rank (split {w})", split_s, ""),
                (f"-np 1, {w} threads (the same cores)", same_s,
                 f"split / this = {ratio:.2f} ({'ok' if ratio <= TARGET else 'OVER'} against "
                 f"{TARGET})"),
                ("-np 1, 1 thread", one_s, f"split is {one_s / split_s:.2f}x as fast"),
                (f"-np {w}, sequence-parallel", seq_s,
                 f"/ split = {seq_s / split_s:.2f}; activations a rank {activations(seq_out)}, "
                 f"split alone {activations(split_out)}")]
        for name, seconds, note in rows:
            print(f"   {name:38} {seconds:.3f} s   {note}")
        trace = os.path.join(work, "trace.json")
        run(args, work, path, w, 1, trace)
        shares = comm_share(trace)
        print("\n2. communication share of the traced split run (instructions on the "
              "communication track / all instructions)")
        for rank, s in enumerate(shares):
            print(f"   rank {rank}: {100 * s:.1f}%")


if __name__ == "__main__":
    main()
