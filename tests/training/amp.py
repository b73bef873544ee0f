#!/usr/bin/python3
"""amp on the CPU device, end to end: bf16 and fp16 loss curves against fp32 over 50 steps
of a small GPT (within a stated tolerance, and still falling); fp16 with a loss scale far too
large skips its first steps, halving the scale each time, then trains; and an fp16 run
stopped and resumed keeps its loss scale, bit for bit.

usage: amp.py EPL WORKDIR SCRIPT
"""
import json
import os
import shutil
import subprocess
import sys

# bf16 keeps 8 bits of mantissa: each stored activation is within 2^-9 of its f32 value.
# Over 50 steps the losses stay within 1% of the f32 run's.
TOLERANCE = 1e-2
STEPS = 50


def run(epl, script, name, *extra):
    metrics = f"{name}.jsonl"
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [epl, "run", script, "--steps", str(STEPS), "--metrics", metrics, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    lines = [json.loads(l) for l in open(metrics)]
    return [l for l in lines if "loss" in l and "step" in l], p.stdout


def falling(name, steps):
    first = sum(s["loss"] for s in steps[:10]) / 10
    last = sum(s["loss"] for s in steps[-10:]) / 10
    if not last < first - 0.5:
        sys.exit(f"FAIL: {name}'s loss does not fall: first ten steps {first:.4f}, last ten {last:.4f}")
    return first, last


def close(name, steps, ref):
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(steps, ref))
    if worst > TOLERANCE:
        sys.exit(f"FAIL: {name} differs from fp32 by {worst:.3g} (tolerance {TOLERANCE})")
    if all(a["loss"] == b["loss"] for a, b in zip(steps, ref)):
        sys.exit(f"FAIL: {name} gives fp32's losses bit for bit: amp changed nothing")
    return worst


def main():
    epl, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # A copy in the work folder: checkpoints go beside the script.
    script = os.path.join(work, "gpt.epl")
    shutil.copy(sys.argv[3], script)
    os.chdir(work)
    ref, _ = run(epl, script, "fp32", "--set", "policy.amp=none")
    falling("fp32", ref)
    for amp in ["bf16", "fp16"]:
        steps, out = run(epl, script, amp, "--set", f"policy.amp={amp}")
        if f"stored in {amp}" not in out:
            sys.exit(f"FAIL: the {amp} run's header does not say so:\n{out}")
        worst = close(amp, steps, ref)
        first, last = falling(amp, steps)
        print(f"{amp}: worst relative difference from fp32 {worst:.3g}; loss {first:.4f} -> {last:.4f}")
    # A loss scale of 2^40: the first steps overflow half's range and are skipped, each
    # halving the scale, until one fits; none after (the window is 2000 steps).
    steps, out = run(epl, script, "overflow", "--set", "policy.amp=fp16",
                     "--set", f"policy.loss_scale={2.0 ** 40}")
    skipped = [s["step"] for s in steps if s.get("skipped")]
    if not skipped or skipped != list(range(1, len(skipped) + 1)):
        sys.exit(f"FAIL: expected the first steps to be skipped, got {skipped}")
    scales = [s["loss_scale"] for s in steps]
    for k in range(1, len(scales)):
        want = scales[k - 1] / 2 if k <= len(skipped) else scales[k - 1]
        if scales[k] != want:
            sys.exit(f"FAIL: loss scale {scales[k]} at step {k + 1}, expected {want}")
    if out.count("the gradients overflowed at loss scale") != len(skipped):
        sys.exit(f"FAIL: the log does not name every skipped step:\n{out}")
    falling("fp16 after overflows", steps[len(skipped):])
    print(f"fp16 from 2^40: steps {skipped[0]}-{skipped[-1]} skipped, scale now {scales[-1]:g}")
    # Stopped after step 20 (a checkpoint keeps the scale) and resumed: the same losses.
    ckpt = ["--set", "policy.amp=fp16", "--set", f"policy.loss_scale={2.0 ** 40}",
            "--set", "train.checkpoint={ dir = \"ckpt\", every = 10 }"]
    straight, _ = run(epl, script, "straight", *ckpt)
    shutil.rmtree("ckpt")
    run(epl, script, "stopped", *ckpt, "--stop-after", "20")
    resumed, _ = run(epl, script, "resumed", *ckpt, "--resume")
    if [s["loss"] for s in resumed] != [s["loss"] for s in straight][20:]:
        sys.exit("FAIL: the resumed fp16 run's losses differ from the straight run's")
    print("fp16 stopped after step 20 and resumed: bit-identical losses")


main()
