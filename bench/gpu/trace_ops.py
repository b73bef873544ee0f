#!/usr/bin/env python3
"""Where a step's time goes: sums an `epl run --trace` file's instructions by op
(`fwd attention`, `bwd linear`, `optimizer adamw`, ...; with --layers, by layer) over the
traced steps after the first, and prints milliseconds per step, largest first, and the
time between instructions (the host's). The trace synchronises the device after each
instruction, so on a GPU each figure is that instruction's own time on the device, launch
included.

usage: trace_ops.py TRACE.json [--top 25] [--layers]
"""
import argparse
import collections
import json
import re


def kind(name):
    """`bwd block.1/mlp` -> `bwd mlp`: the op, whichever layer it belongs to."""
    head, _, rest = name.partition(" ")
    return f"{head} {re.sub(r'[.][0-9]+$', '', rest.split('/')[-1])}" if rest else head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--layers", action="store_true", help="each layer apart, not summed by op")
    a = ap.parse_args()
    events = [e for e in json.load(open(a.trace))["traceEvents"] if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in events})
    kept = steps[1:] or steps  # the first step warms up
    per, count = collections.Counter(), collections.Counter()
    for e in events:
        if e["args"]["step"] in kept:
            e["name"] = e["name"] if a.layers else kind(e["name"])
            per[e["name"]] += e["dur"] / 1e3 / len(kept)
            count[e["name"]] += 1
    total = sum(per.values())
    # The host's own time: the step's span less its instructions (the interpreter between
    # them; the loss and gradient-norm reads wait inside theirs).
    span = 0.0
    for st in kept:
        mine = [e for e in events if e["args"]["step"] == st]
        span += (max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) / 1e3
    span /= len(kept)
    print(f"{len(kept)} traced step(s) counted: {total:.1f} ms of instructions a step, "
          f"{span - total:.2f} ms between them")
    for name, ms in per.most_common(a.top):
        print(f"  {name:32s} {ms:9.2f} ms  {ms / total:6.1%}  ({count[name] // len(kept)} a step)")


if __name__ == "__main__":
    main()
