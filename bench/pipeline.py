#!/usr/bin/python3
"""Pipelines of one-device stages: measured bubble vs theory, step time vs one device,
and activation memory per stage, planned vs measured.

The model is bench/pipeline_gpt{p}.epl: a char-GPT (d 256, 8 heads, seq 128) cut into p
stages of equal blocks (4 blocks at p = 2 and 4, 8 at p = 8), micro-batches of 4 samples.

1. Bubble: for each p, m and schedule, `epl run -np p --trace` prints
   `bubble: measured X% over K steps (schedule: Y% in unit costs)`: the idle share
   (time not in a compute instruction) of p x one window per step, from the first rank's
   start to the last rank's end, averaged over steps. Printed beside the classic
   (p - 1) / (m + p - 1) and the schedule's simulated figure, and beside the same idle
   share computed here from the trace over the steps' makespans (steps 2 on), a check of
   epl's figure. Targets: |measured - classic| <= 0.05 for gpipe and 1f1b; zb's bubble
   <= 0.6 x 1f1b's.
2. Step time at -np p (1f1b, 8 micro-batches, no trace: a traced run synchronizes after
   every instruction) vs -np 1 on the same cores (one rank with p times the threads):
   median `step_seconds` of the metrics file after 2 warm-up steps. Also -np 1 with one
   rank's threads, and the ideal pipeline from it: that time / p / (1 - classic bubble).
3. Activation memory: the run's `activations: stage S measured N micro-batches (X),
   planned N (X); …` line, where this epl prints it. Target: measured within 10%.

usage: bench/pipeline.py [--epl build/epl] [--stages 2] [--micro 4,8,16]
                         [--schedules gpipe,1f1b,zb] [--steps 6] [--time-steps 10] [--quick]
                         [--keep DIR]
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
SAMPLES = 4  # per micro-batch, so every m does the same work per micro-batch
WARMUP = 2
TOLERANCE = 0.05

BUBBLE = re.compile(r"^bubble: measured ([0-9.]+)% over (\d+) steps? \(schedule: ([0-9.]+)% (.*)\)$",
                    re.M)
ACTIVATIONS = re.compile(r"^activations: (.*)$", re.M)
ACT_STAGE = re.compile(r"stage (\d+) measured (\d+) micro-batch(?:es)? \(([0-9.]+ ?[KMGT]?i?B)\), "
                       r"planned (\d+) \(([0-9.]+ ?[KMGT]?i?B)\)")
PLANNED = re.compile(r"^pipeline: .*activations in flight: (.*)$", re.M)
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
         "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def nbytes(text):
    number, unit = re.match(r"([0-9.]+) ?(\w+)", text).groups()
    return float(number) * UNITS[unit]


def classic(p, m):
    return (p - 1) / (m + p - 1)


def epl_run(args, work, p, np, steps, sets, threads, trace=None):
    """Runs the p-stage script on np ranks; returns (output, step_seconds of every step)."""
    script = os.path.join(HERE, f"pipeline_gpt{p}.epl")
    metrics = os.path.join(work, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.epl, "run", script, "-np", str(np), "--steps", str(steps), "--threads",
           str(threads), "--metrics", metrics]
    if trace:
        cmd += ["--trace", trace]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, cwd=work)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    rows = [json.loads(l) for l in open(metrics) if "step_seconds" in l]
    return r.stdout + r.stderr, [row["step_seconds"] for row in rows]


def makespan_bubble(trace):
    """The bubble as the schedules define it, from the Chrome trace: the idle share of
    p x makespan, a step's makespan running from the first event of any rank to the last
    event of any rank (the trace's clocks start at one barrier). Steps 2 on, averaged."""
    events = [e for e in json.load(open(trace))["traceEvents"] if e["ph"] == "X"]
    steps = {}
    for e in events:
        first, last, busy, ranks = steps.get(e["args"]["step"], (e["ts"], e["ts"], 0.0, set()))
        if e["tid"] == 0:  # the compute track
            busy += e["dur"]
        ranks.add(e["pid"])
        steps[e["args"]["step"]] = (min(first, e["ts"]), max(last, e["ts"] + e["dur"]), busy, ranks)
    shares = [1 - busy / (len(ranks) * (last - first))
              for step, (first, last, busy, ranks) in steps.items() if step >= 2 and last > first]
    return statistics.mean(shares) if shares else None


def bubble_run(args, work, p, m, sched, threads):
    """One traced run: epl's measured and simulated bubble, the makespan bubble, step time."""
    trace = os.path.join(work, f"t-{p}-{m}-{sched}.json")
    sets = [f"policy.micro_batches={m}", f"train.batch={SAMPLES * m}", f"policy.schedule={sched}"]
    out, times = epl_run(args, work, p, p, args.steps, sets, threads, trace)
    found = BUBBLE.search(out)
    if not found:
        sys.exit(f"no `bubble:` line in the run's output:\n{out[-2000:]}")
    return {"measured": float(found[1]) / 100, "simulated": float(found[3]) / 100,
            "how": "" if found[4] == "in unit costs" else f" (schedule: {found[4]})",
            "makespan": makespan_bubble(trace),
            "step": statistics.median(times[1:] if len(times) > 1 else times), "out": out}


def within(value, p, m, sched):
    """|value - classic| and, for the schedules the classic formula describes, the mark."""
    diff = abs(value - classic(p, m))
    return diff, "" if sched == "zb" else ("ok" if diff <= TOLERANCE else "OVER")


def bubbles(args, work, cores):
    print(f"1. bubble, one rank a stage, micro-batches of {SAMPLES} samples, {args.steps} traced "
          f"steps a run")
    print("   epl: its `bubble:` line (idle share of p x one window a step, every step); "
          "makespan: the same")
    print("   computed here from the trace, step 1 left out; unit: the schedule simulated")
    print(f"   {'p':>2} {'m':>3} {'schedule':8} {'epl':>6} {'makespan':>8} {'classic':>7} "
          f"{'unit':>6}   {'|epl-classic|':>13}   {'|makespan-classic|':>18}   {'step s':>6}")
    results = {}
    for p in args.stages:
        for m in args.micro:
            for sched in args.schedules:
                r = bubble_run(args, work, p, m, sched, max(1, cores // p))
                results[p, m, sched] = r
                diff, mark = within(r["measured"], p, m, sched)
                span, sdiff = f"{'-':>8}", f"{'-':>18}"  # a run of one step has no makespan
                if r["makespan"] is not None:
                    span = f"{r['makespan']:8.1%}"
                    sdiff = "{:12.1%} {:5}".format(*within(r["makespan"], p, m, sched))
                print(f"   {p:2} {m:3} {sched:8} {r['measured']:6.1%} {span} "
                      f"{classic(p, m):7.1%} {r['simulated']:6.1%}   {diff:7.1%} {mark:5}   "
                      f"{sdiff}   {r['step']:6.3f}{r['how']}")
    print(f"   targets: |epl - classic| <= {TOLERANCE:.2f} for gpipe and 1f1b; step s: median "
          f"step time of the traced run, step 1 left out")
    if "zb" in args.schedules and "1f1b" in args.schedules:
        print("   zb against 1f1b at the same p and m (target: bubble ratio <= 0.6)")
        for p in args.stages:
            for m in args.micro:
                zb, base = results[p, m, "zb"], results[p, m, "1f1b"]
                ratio = lambda key: zb[key] / base[key] if base[key] else float("inf")
                span = ("" if zb["makespan"] is None else
                        f"; makespan {zb['makespan']:.1%} / {base['makespan']:.1%} = "
                        f"{ratio('makespan'):.2f}")
                print(f"   p {p} m {m:2}: epl bubble {zb['measured']:.1%} / {base['measured']:.1%} "
                      f"= {ratio('measured'):.2f} {'ok' if ratio('measured') <= 0.6 else 'OVER'}"
                      f"{span}; step time {zb['step']:.3f} / {base['step']:.3f} s = "
                      f"{ratio('step'):.2f}")
    print()
    return results


def step_times(args, work, cores):
    med = lambda times: statistics.median(times[WARMUP:])
    timed = args.time_steps - WARMUP
    print(f"2. step time, 1f1b, 8 micro-batches of {SAMPLES} samples, no trace; median of "
          f"{timed} step{'s' if timed > 1 else ''} after {WARMUP} warm-up (metrics "
          f"`step_seconds`)")
    for p in args.stages:
        threads = max(1, cores // p)
        together = min(cores, threads * p)
        note = f" (oversubscribed: {p} ranks on {cores} cores)" if p > cores else ""
        sets = ["policy.micro_batches=8", f"train.batch={SAMPLES * 8}", "policy.schedule=1f1b"]
        pipe = med(epl_run(args, work, p, p, args.time_steps, sets, threads)[1])
        one = med(epl_run(args, work, p, 1, args.time_steps, sets, together)[1])
        alone = med(epl_run(args, work, p, 1, args.time_steps, sets, threads)[1])
        plural = "s" if threads > 1 else ""
        print(f"   p {p}: -np {p}, {threads} thread{plural} a rank{note}: {pipe:.3f} s")
        print(f"        -np 1, {together} threads (the same cores): {one:.3f} s   "
              f"ratio pipeline / one device {pipe / one:.2f}")
        if p > cores:
            versus = "no ideal: the ranks share cores"
        else:
            ideal = alone / p / (1 - classic(p, 8))
            versus = (f"ideal pipeline {ideal:.3f} s = that / {p} / (1 - {classic(p, 8):.3f}); "
                      f"measured / ideal {pipe / ideal:.2f}")
        print(f"        -np 1, {threads} thread{plural} (one rank's share): {alone:.3f} s   {versus}")
    print()


def activations(results):
    print("3. activation memory per stage, planned vs measured (target: within 10%)")
    for (p, m, sched), r in results.items():
        found = ACTIVATIONS.search(r["out"])
        if not found:
            planned = PLANNED.search(r["out"])
            print(f"   p {p} m {m:2} {sched:5}: measured not reported by this epl; planned "
                  f"{planned[1] if planned else '-'}")
            continue
        stages = ACT_STAGE.findall(found[1])
        if not stages:
            print(f"   p {p} m {m:2} {sched:5}: unparsed: {found[0]}")
        for s, mn, mb, pn, pb in stages:
            ratio = nbytes(mb) / nbytes(pb) if nbytes(pb) > 0 else float("inf")
            print(f"   p {p} m {m:2} {sched:5} stage {s}: planned {pn} micro-batches ({pb}), "
                  f"measured {mn} ({mb}), ratio {ratio:.3f} "
                  f"{'ok' if abs(ratio - 1) <= 0.1 and mn == pn else 'OFF'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epl", default=os.path.join(HERE, "..", "build", "epl"))
    ap.add_argument("--stages", default="2", help="pipeline depths p, e.g. 2,4,8")
    ap.add_argument("--micro", help="micro-batch counts m (default 4,8,16)")
    ap.add_argument("--schedules", default="gpipe,1f1b,zb")
    ap.add_argument("--steps", type=int, help="traced steps of a bubble run (default 6)")
    ap.add_argument("--time-steps", type=int, help="steps of a step-time run (default 10)")
    ap.add_argument("--quick", action="store_true",
                    help="defaults of m 4,8, 3 traced and 4 timed steps")
    ap.add_argument("--keep", metavar="DIR", help="keep the traces (t-P-M-SCHEDULE.json) in DIR")
    args = ap.parse_args()
    args.epl = os.path.abspath(args.epl)  # the runs start in a work folder
    defaults = ("4,8", 3, WARMUP + 2) if args.quick else ("4,8,16", 6, 10)
    for key, value in zip(("micro", "steps", "time_steps"), defaults):
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.stages = [int(p) for p in args.stages.split(",")]
    args.micro = [int(m) for m in args.micro.split(",")]
    args.schedules = args.schedules.split(",")
    if args.time_steps <= WARMUP:
        ap.error(f"--time-steps must be above the {WARMUP} warm-up steps")
    for p in args.stages:
        if not os.path.exists(os.path.join(HERE, f"pipeline_gpt{p}.epl")):
            ap.error(f"no bench/pipeline_gpt{p}.epl for --stages {p}")
    cores = len(os.sched_getaffinity(0))
    print(f"pipeline of bench/pipeline_gpt{{p}}.epl (char-GPT, d 256, seq 128), {cores} cores\n")
    with tempfile.TemporaryDirectory() as scratch:
        work = scratch
        if args.keep:
            work = os.path.abspath(args.keep)
            os.makedirs(work, exist_ok=True)
        results = bubbles(args, work, cores)
        step_times(args, work, cores)
        activations(results)


if __name__ == "__main__":
    main()
