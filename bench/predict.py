#!/usr/bin/python3
"""Predicted vs measured step time on this machine: `epl calibrate`, then for each case
`epl plan --cluster here --json` (the prediction) and `epl run --device cpu` (the median
step after 2 warm-up steps, from the metrics file; on the CPU that `epl calibrate` measured,
on a machine with a GPU too), side by side in one run.

Cases: the Fashion-MNIST MLP and CNN and the data-parallel char-GPT at -np 1 and 2, the
char-GPT as a 2-stage pipeline (bench/pipeline_gpt2.epl) and split 2 ways
(bench/split_gpt.epl) at -np 2; on a machine of at least 4 cores also at -np 4: the
data-parallel char-GPT, a 4-stage pipeline (bench/pipeline_gpt4.epl) and split 2 ways
with 2 data-parallel copies (with --shared on fewer cores too: the ranks share them, as
the cost model's core share says). --only TEXT keeps the cases whose script path contains
TEXT. Target (issue figure): within 15% of the measured median.

A shared machine's speed drifts by tens of percent from minute to minute, so each case runs
--repeats times (3), the cases taking turns, and its measured figure is the median of its
runs' medians; the spread of those runs is printed beside it.

With --ops, each case also runs once with `--trace`, and each op's predicted seconds a step
(`predicted.ops` of `epl plan --json`: the busiest rank's) are printed beside its median in
the trace (the rank `ops_rank`, the steps after the warm-up), the ops that take longest
first: where the model misses.

usage: bench/predict.py [--epl build/epl] [--steps 12] [--repeats 3] [--calibration FILE]
                        [--ops [N]] [--shared] [--only TEXT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
ENV.setdefault("EPL_STDLIB", os.path.join(ROOT, "stdlib"))
WARMUP = 2
CASES = [("examples/mlp_fashion.epl", 1), ("examples/mlp_fashion.epl", 2),
         ("examples/cnn_fashion.epl", 1), ("examples/cnn_fashion.epl", 2),
         ("examples/gpt_char_dp.epl", 1), ("examples/gpt_char_dp.epl", 2),
         ("bench/pipeline_gpt2.epl", 2), ("bench/split_gpt.epl", 2),
         # amp: on a CPU with bf16 kernels its products run in bf16, a grid of their own.
         ("examples/gpt_char_dp.epl amp=bf16", 1), ("examples/gpt_char_dp.epl amp=bf16", 2)]
# Four ranks on fewer than four cores share them: timings of that measure the sharing.
CASES_4 = [("examples/gpt_char_dp.epl", 4), ("bench/pipeline_gpt4.epl", 4),
           ("bench/split_gpt.epl", 4)]
SETTINGS = ["--set", "train.eval=none", "--set", "train.checkpoint=none"]
# `here`'s calibration measures the CPU: the runs stay on it on a machine with a GPU too.
RUN = ["--device", "cpu"]


def case_args(script):
    """A case's script path, its policy settings (`path key=value ...` sets policy.key), and
    a name for its files."""
    path, *policy = script.split()
    settings = [a for kv in policy for a in ("--set", f"policy.{kv}")]
    tag = os.path.basename(path) + "".join(f".{kv.replace('=', '_')}" for kv in policy)
    return os.path.join(ROOT, path), settings + SETTINGS, tag


def measure(args, env, work, script, np):
    """The median step of one `epl run` after the warm-up steps, in seconds."""
    path, settings, tag = case_args(script)
    metrics = os.path.join(work, f"{tag}.{np}.jsonl")
    run = subprocess.run([args.epl, "run", path, "-np", str(np), "--steps", str(args.steps),
                          "--metrics", metrics] + RUN + settings, env=env, capture_output=True,
                         text=True)
    if run.returncode != 0:
        sys.exit(f"epl run {script} -np {np} failed:\n{run.stdout}{run.stderr}")
    steps = [r["step_seconds"] for r in map(json.loads, open(metrics)) if "step_seconds" in r]
    return statistics.median(steps[WARMUP:])


def traced_ops(args, env, work, script, np, rank):
    """Each Run instruction's seconds a step on `rank` in one traced `epl run`, by the
    trace's name: the median over the steps after the warm-up of each step's sum."""
    path, settings, tag = case_args(script)
    trace = os.path.join(work, f"{tag}.{np}.trace.json")
    run = subprocess.run([args.epl, "run", path, "-np", str(np), "--steps", str(args.steps),
                          "--trace", trace, "--metrics", os.path.join(work, "traced.jsonl")]
                         + RUN + settings, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"epl run --trace {script} -np {np} failed:\n{run.stdout}{run.stderr}")
    events = json.load(open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    by_step = {}
    for e in events:
        step = e.get("args", {}).get("step")
        if e.get("ph") != "X" or e.get("pid") != rank or step is None or step <= WARMUP:
            continue
        names = by_step.setdefault(step, {})
        names[e["name"]] = names.get(e["name"], 0) + e["dur"] / 1e6
    names = {n for step in by_step.values() for n in step}
    return {n: statistics.median(step.get(n, 0) for step in by_step.values()) for n in names}


def print_ops(script, np, plan, traced, top):
    """The case's ops, predicted against traced, the longest traced first."""
    ops = {o["name"]: o["seconds"] for o in plan["ops"]}
    print(f"\n{script} -np {np}, rank {plan['ops_rank']}: the {top} ops that take longest "
          f"(seconds a step)")
    print(f"  {'op':44} {'predicted':>10} {'traced':>10} {'pred/traced':>11}")
    shown = sorted((n for n in ops if n in traced), key=lambda n: -traced[n])[:top]
    for n in shown:
        print(f"  {n[:44]:44} {ops[n]:>10.4g} {traced[n]:>10.4g} {ops[n] / traced[n]:>11.2f}")
    total_p = sum(ops[n] for n in ops if n in traced)
    total_t = sum(traced[n] for n in ops if n in traced)
    other = sorted(n for n in traced if n not in ops)
    print(f"  {'all the compute ops':44} {total_p:>10.4g} {total_t:>10.4g} "
          f"{total_p / total_t:>11.2f}")
    if other:
        print(f"  traced but not compute ops: " + ", ".join(
            f"{n} {traced[n]:.3g}" for n in sorted(other, key=lambda n: -traced[n])[:6]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epl", default=os.path.join(ROOT, "build", "epl"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calibration", help="use this cluster file instead of calibrating")
    ap.add_argument("--ops", type=int, nargs="?", const=12, default=0,
                    help="also trace each case and print its N longest ops, predicted "
                    "against traced (12)")
    ap.add_argument("--shared", action="store_true",
                    help="run the -np 4 cases on fewer than 4 cores too (the ranks share "
                    "them; the cost model gives each rank its share)")
    ap.add_argument("--only", metavar="TEXT",
                    help="only the cases whose script's path contains TEXT")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        here = args.calibration or os.path.join(work, "here.json")
        env = dict(ENV, EPL_CLUSTER_HERE=here)
        if not args.calibration:
            r = subprocess.run([args.epl, "calibrate"], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"epl calibrate failed:\n{r.stdout}{r.stderr}")
            print(r.stderr.strip(), flush=True)
        cores = os.cpu_count() or 1
        cases = CASES + (CASES_4 if cores >= 4 or args.shared else [])
        cases = [c for c in cases if not args.only or args.only in c[0]]
        predicted, plans = {}, {}
        for script, np in cases:
            path, settings, _ = case_args(script)
            plan = subprocess.run([args.epl, "plan", path, "-np", str(np), "--cluster", "here",
                                   "--json"] + settings, env=env, capture_output=True, text=True)
            if plan.returncode != 0:
                sys.exit(f"epl plan {script} -np {np} failed:\n{plan.stderr}")
            plans[script, np] = json.loads(plan.stdout)["predicted"]
            predicted[script, np] = plans[script, np]["step_seconds"]
        runs = {case: [] for case in cases}
        for _ in range(args.repeats):
            for script, np in cases:
                runs[script, np].append(measure(args, env, work, script, np))
                # As it goes, so that a run cut short by a time limit still says something.
                print(f"  {script} -np {np}: predicted {predicted[script, np]:.4f}s, measured "
                      f"{runs[script, np][-1]:.4f}s", file=sys.stderr, flush=True)
        print(f"\n{'case':44} {'np':>3} {'predicted':>10} {'measured':>10} {'pred/meas':>9}"
              f"  runs' medians")
        ratios = []
        for script, np in cases:
            measured = statistics.median(runs[script, np])
            ratios.append(predicted[script, np] / measured)
            spread = " ".join(f"{r:.4f}" for r in runs[script, np])
            print(f"{script:44} {np:>3} {predicted[script, np]:>9.4f}s {measured:>9.4f}s "
                  f"{ratios[-1]:>9.2f}  {spread}")
        within = sum(abs(r - 1) <= 0.15 for r in ratios)
        print(f"\n{within} of {len(ratios)} within 15% of the measured median "
              f"(pred/meas {min(ratios):.2f} to {max(ratios):.2f}); target: all")
        if cores < 4 and not args.shared:
            print(f"the -np 4 cases left out: this machine has {cores} cores")
        for script, np in cases if args.ops else []:
            traced = traced_ops(args, env, work, script, np, plans[script, np]["ops_rank"])
            print_ops(script, np, plans[script, np], traced, args.ops)


if __name__ == "__main__":
    main()
