#!/usr/bin/python3
"""Random plans: small models of random layers over random pipeline stages (their groups
pinned or not) and split blocks, under random policies and optimizers, run for a few steps
at -np 1 and at another -np, looking for what no hand-written test asked for. A plan that
stops on an internal error, a crash or a hang is a finding; so is one whose losses leave
-np 1's (relative 1e-5, 1e-3 under `amp`, 5e-3 with half-precision gradient wires); and,
with --resume, a run stopped at a checkpoint and resumed at other settings (-np, ZeRO,
schedule, recompute) that crashes, or whose losses after the checkpoint leave -np 1's
uninterrupted ones (a resumption refused with an error is printed, not counted). User
errors (a -np the plan does not divide, a setting given twice) are counted, not reported.

The scripts it writes stay in WORKDIR, named by seed and trial, so a finding can be run
again by hand. Not run by the tests: a run of 50 plans takes a few minutes on 2 cores.

usage: tools/random_plans.py [--epl build/epl] [--work /tmp/epl-random-plans] [--seed 1]
                             [--plans 50] [--resume]
"""
import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Statements over h [B, T, 32] (a token model) and over h [B, C, H, W] (an image model);
# `u = …` leaves a layer no loss reads.
TOKEN_LAYERS = [
    "h = h + attention(layer_norm(h), 4)",
    "h = h + attention(h, 4, kv_heads = 2, rotary = true)",
    "h = h + mlp(layer_norm(h), 64)",
    "h = h + moe(layer_norm(h), 4, 64, top_k = 2, capacity_factor = 1.0)",
    "h = layer_norm(h)",
    "h = rms_norm(h)",
    "h = dropout(h, p = 0.1)",
    "h = gelu(linear(h, 32))",
    "h = relu(h)",
    "u = linear(h, 32)",
    "u = attention(h, 4)",
]
SPLIT_LAYERS = [
    "split(2) { h = h + attention(layer_norm(h), 4) }",
    "split(2) { h = h + mlp(layer_norm(h), 64) }",
    "split(2) { h = linear(relu(linear(h, 64)), 32) }",
    "split(2) { h = h + moe(layer_norm(h), 4, 64, top_k = 2, capacity_factor = 1.0) }",
]
IMAGE_FIRST = ["p = max_pool(x, 2)", "p = avg_pool(x, 2)", "p = dropout(x, p = 0.2)", "p = relu(x)",
               "p = x"]
IMAGE_LAYERS = [
    "h = relu(conv2d(h, 8, 3, padding = 1))",
    "h = batch_norm(h)",
    "h = max_pool(h, 2)",
    "h = relu(batch_norm(conv2d(h, 8, 3, padding = 1, bias = false)))",
    "u = conv2d(h, 4, 3, padding = 1)",
]
POLICIES = ["zero = 1", "zero = 2", "zero = 3", "recompute = every", "recompute = auto",
            "amp = bf16", "amp = fp16", "schedule = gpipe", "schedule = zb",
            "schedule = interleaved\n  chunks = 2", "sequence_parallel = true",
            "comm_dtype = bf16", "offload = optimizer", "offload = optimizer\n  offload_to = disk",
            "offload = params\n  offload_to = disk", "overlap_comm = false", "bucket_mb = 0"]
TEXT = "/usr/share/games/fortunes/cookie"


def token_model(rng, stages):
    body = [[rng.choice(TOKEN_LAYERS + SPLIT_LAYERS) for _ in range(rng.randint(1, 3))]
            for _ in range(stages)]
    head_split = rng.random() < 0.3
    tie = ", bias = false, tie = embedding" if rng.random() < 0.4 else ""
    # A stage of split blocks takes their width; another may pin a group of 2 (uneven groups).
    width = [2 if any("split" in s for s in body[k]) or (head_split and k == stages - 1)
             else rng.choice([1, 1, 2]) for k in range(stages)]
    lines = ["model net(tokens: i32[B, 16]) {", f"  replicate({width[0]}) {{",
             "    h = embedding(tokens, 256, 32) + positions(16, 32)"]
    for k in range(stages):
        if k > 0:
            lines += ["  }", f"  replicate({width[k]}) {{"]
        lines += ["    " + s for s in body[k]]
    head = f"cross_entropy(linear(h, 256{tie}), next(tokens))"
    lines.append(f"    split(2) {{ loss = {head} }}" if head_split else
                 f"    loss = cross_entropy(linear(layer_norm(h), 256{tie}), next(tokens))")
    lines += ["  }", "  return loss", "}"]
    return "\n".join(lines), f'data = text("{TEXT}", seq = 16)'


def image_model(rng, stages):
    lines = ["model net(x: f32[B, 1, 16, 16], y: i32[B]) {", "  replicate(1) {",
             "    " + rng.choice(IMAGE_FIRST), "    h = relu(conv2d(p, 8, 3, padding = 1))"]
    for k in range(stages):
        if k > 0:
            lines += ["  }", "  replicate(1) {"]
        lines += ["    " + rng.choice(IMAGE_LAYERS) for _ in range(rng.randint(1, 3))]
    lines += ["    loss = cross_entropy(linear(flatten(h), 8), y)", "  }", "  return loss", "}"]
    return "\n".join(lines), "data = synthetic(samples = 64, classes = 8)"


def script(rng):
    stages = rng.choice([1, 1, 2, 3])
    model, data = (token_model if rng.random() < 0.5 else image_model)(rng, stages)
    policy = rng.sample(POLICIES, rng.randint(0, 3))
    clip = "  clip_grad_norm = 0.5\n" if rng.random() < 0.3 else ""
    sgd = "  optimizer = sgd(lr = 0.05, momentum = 0.9)\n" if rng.random() < 0.25 else ""
    text = (f"{model}\npolicy {{\n  micro_batches = {rng.choice([1, 2, 4])}\n"
            + "".join(f"  {p}\n" for p in policy)
            + f"}}\ntrain net {{\n  {data}\n  batch = 48\n{clip}{sgd}}}\n")
    # Two batch_norms or more (one renormalising the other through a relu and a convolution):
    # the first's shift gets a gradient that is mostly cancellation, whose rounding differs between plans and which
    # Adam amplifies (docs/language.md, batch_norm: 8e-5 apart by step 4 on one such plan;
    # under SGD 1e-7).
    chained = model.count("batch_norm(") >= 2
    loose = chained or any(p.startswith(("amp", "comm_dtype")) for p in policy)
    # A bf16 wire rounds every summed gradient to 8 bits of mantissa, a different sum at each
    # -np: seed 116's plan 1 (SGD with momentum, the loss halving in 4 steps) was 1.5e-3
    # apart at -np 6 by step 4, and 1e-7 with an f32 wire.
    wire = any(p.startswith("comm_dtype") for p in policy)
    return text, (5e-3 if wire else 1e-3 if loose else 1e-5)


def run(args, path, np_, steps, extra, metrics):
    """`epl run` for `steps` steps: (exit status or "timeout", output, losses)."""
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.epl, "run", path, "-np", str(np_), "--steps", str(steps), "--metrics", metrics]
    try:
        out = subprocess.run(cmd + extra, cwd=args.work, capture_output=True, text=True,
                             timeout=300)
    except subprocess.TimeoutExpired:
        return "timeout", "", []
    losses = []
    if out.returncode == 0 and os.path.exists(metrics):
        for line in open(metrics):
            rec = json.loads(line)
            if "loss" in rec and "run" not in rec and "eval_loss" not in rec:
                losses.append(rec["loss"])
    return out.returncode, out.stdout + out.stderr, losses


def broken(rc, text):
    return rc not in (0, 1, 2) or any(w in text for w in ("internal error", "Segmentation",
                                                          "AddressSanitizer", "runtime error"))


def first_error(text):
    return next((l for l in text.splitlines() if "error" in l), "").strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epl", default=os.path.join(HERE, "..", "build", "epl"))
    ap.add_argument("--work", default="/tmp/epl-random-plans")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plans", type=int, default=50)
    ap.add_argument("--resume", action="store_true",
                    help="also stop each plan at a checkpoint and resume it at other settings")
    args = ap.parse_args()
    args.epl = os.path.abspath(args.epl)
    os.makedirs(args.work, exist_ok=True)
    os.environ.setdefault("EPL_STDLIB", os.path.join(HERE, "..", "stdlib"))
    os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    rng = random.Random(args.seed)
    counts, findings = collections.Counter(), 0
    for trial in range(args.plans):
        text, tol = script(rng)
        path = os.path.join(args.work, f"plan_{args.seed}_{trial}.epl")
        metrics = os.path.join(args.work, f"metrics_{args.seed}.jsonl")
        open(path, "w").write(text)
        other = rng.choice([2, 3, 4, 6])
        losses = {}
        for np_ in (1, other):
            rc, out, losses[np_] = run(args, path, np_, 4, [], metrics)
            counts["ran" if rc == 0 else "user error" if rc in (1, 2) else "broken"] += 1
            if broken(rc, out):
                findings += 1
                print(f"FINDING {path} -np {np_}: exit {rc}: {first_error(out)}", flush=True)
        a, b = losses[1], losses[other]
        if a and b:
            worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))
            if len(a) != len(b) or worst > tol:
                findings += 1
                print(f"FINDING {path} -np {other}: losses {b} against -np 1's {a} "
                      f"(relative {worst:.2e}, tolerance {tol:g})", flush=True)
        if args.resume and a:
            ckpt = os.path.join(args.work, f"ckpt_{args.seed}")
            shutil.rmtree(ckpt, ignore_errors=True)
            resumable = path.replace(".epl", "_ckpt.epl")
            open(resumable, "w").write(text.replace(
                "train net {", f'train net {{\n  checkpoint = {{ dir = "{ckpt}", every = 2 }}'))
            first, then = rng.choice([1, 2, 4, 6]), rng.choice([1, 2, 4, 6])
            setting = rng.choice(["", "policy.zero=2", "policy.schedule=gpipe",
                                  "policy.recompute=every"])
            rc, out, _ = run(args, resumable, first, 2, [], metrics)
            if rc == 0:
                rc, out, resumed = run(args, resumable, then, 4,
                                       ["--resume"] + (["--set", setting] if setting else []),
                                       metrics)
                counts["resumed" if rc == 0 else "resume refused"] += 1
                where = f"{resumable}: -np {first} resumed at -np {then} {setting}"
                if broken(rc, out):
                    findings += 1
                    print(f"FINDING {where}: exit {rc}: {first_error(out)}", flush=True)
                elif rc != 0:
                    print(f"refused {where}: {first_error(out)}", flush=True)
                # Steps 3 and 4 after the checkpoint of step 2: -np 1's, uninterrupted.
                tail = a[len(a) - len(resumed):] if resumed else []
                if resumed and (len(resumed) > len(a) or any(
                        abs(x - y) / max(abs(y), 1e-12) > tol for x, y in zip(resumed, tail))):
                    findings += 1
                    print(f"FINDING {where}: losses {resumed} against -np 1's {tail} "
                          f"uninterrupted (tolerance {tol:g})", flush=True)
    print(f"{args.plans} plans: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + f"; {findings} finding(s)")
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
