#!/usr/bin/python3
"""Data parallelism and pipelines equal one device: runs one script with `epl run -np N`
for each N (real mpirun ranks) and compares the loss of every step, and the final
validation loss, with the -np 1 run; with moe layers, also the share of token copies the
experts' capacity dropped at every step (equal) and the load-balancing loss. --exact KEY=VALUE[&KEY=VALUE...] runs each -np N again
with those settings too and requires bit-identical losses (gpipe and 1f1b: the same arithmetic in
another order).

usage: equivalence.py EPL WORKDIR SCRIPT [--np 1 2 4] [--tol 1e-5] [--steps 20 or $EPL_EQUIVALENCE_STEPS]
                      [--set KEY=VALUE ...] [--pin N] [--width W] [--expect TEXT ...]
                      [--exact KEY=VALUE ...]
"""
import argparse
import json
import os
import subprocess
import sys


def run(epl, work, script, name, args, steps, sets, skip=None):
    """`epl run SCRIPT ARGS` for `steps` steps; its output and metrics are saved in work as
    NAME.out and NAME.jsonl. Returns the loss of every step, the validation losses, what
    it printed, and with moe layers each step's (load-balancing loss, dropped share). A failure ends the test, or skips it (exit 77) when skip(stderr) says so."""
    metrics = os.path.join(work, f"{name}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [epl, "run", script, *args, "--steps", str(steps), "--metrics", metrics]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
    with open(os.path.join(work, f"{name}.out"), "w") as f:
        f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        if skip and skip(out.stderr):
            print(f"skipped: {out.stderr.strip()}")
            sys.exit(77)
        sys.exit(f"FAIL: {' '.join(cmd)} exited {out.returncode}\n{out.stdout}\n{out.stderr}")
    losses, evals, moe = [], [], []
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "run" in rec:  # the run's header
                continue
            if "eval_loss" in rec:
                evals.append(rec["eval_loss"])
            else:
                losses.append(rec["loss"])
                if "moe_dropped" in rec:
                    moe.append((rec["moe_aux_loss"], rec["moe_dropped"]))
    if len(losses) != steps:
        sys.exit(f"FAIL: {name} logged {len(losses)} steps, expected {steps}")
    return losses, evals, out.stdout, moe


def compare_moe(ref, moe, name, tol):
    """The experts' routing of every step: the same share of copies dropped as one device,
    and the same load-balancing loss within the tolerance."""
    if len(moe) != len(ref):
        sys.exit(f"FAIL: {name} logged moe statistics for {len(moe)} steps, np1 {len(ref)}")
    worst = 0.0
    for i, ((aux, dropped), (ref_aux, ref_dropped)) in enumerate(zip(moe, ref)):
        if dropped != ref_dropped:
            sys.exit(f"FAIL: step {i + 1}: {name} dropped {dropped:.6f} of the copies, "
                     f"np1 {ref_dropped:.6f}")
        worst = max(worst, abs(aux - ref_aux) / max(abs(ref_aux), 1e-30))
    if worst > tol:
        sys.exit(f"FAIL: {name}'s load-balancing loss differs from np1 by {worst:.2e}")
    shares = [d for _, d in ref]
    print(f"moe: {name} dropped the copies np1 dropped at every step "
          f"({100 * min(shares):.1f}%-{100 * max(shares):.1f}%), load-balancing loss within "
          f"{worst:.2e}")


def compare(ref, ref_eval, losses, evals, ref_name, name):
    """Prints every step's pair and returns the worst relative difference."""
    worst = 0.0
    for i, (x, y) in enumerate(zip(ref, losses)):
        rel = abs(x - y) / max(abs(x), 1e-30)
        worst = max(worst, rel)
        print(f"step {i + 1:2}: {ref_name} {x:.9f}  {name} {y:.9f}  rel {rel:.2e}")
    if len(evals) != len(ref_eval):
        sys.exit(f"FAIL: {name} ran {len(evals)} evaluations, {ref_name} ran {len(ref_eval)}")
    for x, y in zip(ref_eval, evals):
        rel = abs(x - y) / max(abs(x), 1e-30)
        worst = max(worst, rel)
        print(f"validation: {ref_name} {x:.9f}  {name} {y:.9f}  rel {rel:.2e}")
    return worst


def require_training(ref):
    """Equal losses prove nothing if training stood still: the loss must move by 5% over 20
    steps or more. The few steps of a sanitizer build only look for memory errors; there
    the loss must move at all."""
    if len(ref) < 20:
        if ref[0] == ref[-1]:
            sys.exit("FAIL: the loss did not change; the comparison is not meaningful")
        return
    if abs(ref[0] - ref[-1]) < 0.05 * abs(ref[0]):
        sys.exit("FAIL: the loss hardly changed; the comparison is not meaningful")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("epl")
    ap.add_argument("work")
    ap.add_argument("script")
    ap.add_argument("--np", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--tol", type=float, default=1e-5)
    # Sanitizer builds run fewer steps (tests/parallel/CMakeLists.txt): every instruction
    # of the step is already checked by the first ones.
    ap.add_argument("--steps", type=int, default=int(os.environ.get("EPL_EQUIVALENCE_STEPS", 20)))
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--pin", type=int, default=0,
                    help="run a copy whose `replicate {` is `replicate(PIN) {`")
    ap.add_argument("--width", type=int, default=0,
                    help="run a copy whose `split(2)` blocks are `split(WIDTH)`")
    ap.add_argument("--groups", default="",
                    help="run a copy whose k-th `replicate {` is `replicate(G_k) {` (1,2)")
    ap.add_argument("--expect", action="append", default=[],
                    help="text the -np > 1 runs must print, _ for a space (8_buckets)")
    ap.add_argument("--exact", action="append", default=[],
                    help="a setting (or several joined by &) whose -np > 1 runs must give "
                    "bit-identical losses")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    script = os.path.abspath(a.script)
    if a.pin:
        text = open(script).read()
        if "replicate {" not in text:
            sys.exit(f"FAIL: --pin needs a `replicate {{` in {script}")
        script = os.path.join(a.work, "pinned.epl")
        with open(script, "w") as f:
            f.write(text.replace("replicate {", f"replicate({a.pin}) {{"))
    if a.width:
        text = open(script).read()
        if "split(2)" not in text:
            sys.exit(f"FAIL: --width needs a `split(2)` in {script}")
        script = os.path.join(a.work, f"width{a.width}.epl")
        with open(script, "w") as f:
            f.write(text.replace("split(2)", f"split({a.width})"))
    if a.groups:
        parts = open(script).read().split("replicate {")
        groups = a.groups.split(",")
        if len(parts) != len(groups) + 1:
            sys.exit(f"FAIL: --groups names {len(groups)} groups for {len(parts) - 1} "
                     f"`replicate {{` in {script}")
        text = parts[0] + "".join(f"replicate({g}) {{" + rest for g, rest in zip(groups, parts[1:]))
        script = os.path.join(a.work, "groups.epl")
        with open(script, "w") as f:
            f.write(text)
    ref, ref_eval, _, ref_moe = run(a.epl, a.work, script, "np1", ["-np", "1"], a.steps, a.sets)
    worst = 0.0
    for np in a.np:
        if np == 1:
            continue
        losses, evals, stdout, moe = run(a.epl, a.work, script, f"np{np}", ["-np", str(np)],
                                         a.steps, a.sets)
        for text in (t.replace("_", " ") for t in a.expect):
            if text not in stdout:
                sys.exit(f"FAIL: -np {np} did not print {text!r}:\n{stdout}")
        worst = max(worst, compare(ref, ref_eval, losses, evals, "np1", f"np{np}"))
        if ref_moe:
            compare_moe(ref_moe, moe, f"np{np}", a.tol)
        for k, extra in enumerate(a.exact):
            other, other_eval, _, _ = run(a.epl, a.work, script, f"np{np}_exact{k}",
                                       ["-np", str(np)], a.steps, a.sets + extra.split("&"))
            if other != losses or other_eval != evals:
                compare(losses, evals, other, other_eval, f"np{np}", f"np{np} {extra}")
                sys.exit(f"FAIL: -np {np} with {extra} is not bit-identical")
            print(f"-np {np} with {extra}: bit-identical losses ({len(other)} steps, "
                  f"{len(other_eval)} validations)")
    print(f"worst relative difference {worst:.2e} (tolerance {a.tol:g})")
    if worst > a.tol:
        sys.exit("FAIL: the parallel runs differ from -np 1")
    require_training(ref)

if __name__ == "__main__":
    main()
