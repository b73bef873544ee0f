#!/usr/bin/python3
"""Memory policies on real ranks: what each saves and what it costs.

The char-GPT of bench/train_step.py (6 transformer blocks, d 256, 8 heads, seq 128, batch
32, AdamW; 4.9 M parameters) at -np N data-parallel (1 thread a rank), and as 2 pipeline
stages (3 blocks each, 4 micro-batches, 1f1b) at -np 2. For each policy (none,
`recompute = every`, `zero = 1`, both, `zero = 2` and `zero = 3` alone and with
recompute, the optimizer states offloaded to disk alone and with the other two,
`amp = bf16` and fp16 with `zero = 2`; the pipeline alone, and in two data-parallel
copies at -np 4 without and with `zero = 3`; the blocks split 2 ways in two copies at
-np 4 without ZeRO and with stages 2 and 3) it
prints rank 0's memory plan (activations, model states in memory with the offload's
staging buffers, and the communicators' scratch), the memory
measured after the first step (the process's peak above what it held before the run's
buffers, less the code it paged in), the median step time after 2 warm-up steps, and
each against the run without a policy. Targets (issue figures): recompute cuts the activations >= 2x for <= 40% more
step time; `recompute = auto` under a `device_memory` halfway between the plans without
recompute and with every block recomputed no slower than `every` under it; the plan within
10% of what is measured; ZeRO-3's model states at most 1/3.5 of those without ZeRO at
-np 4.

usage: bench/memory.py [--epl build/epl] [--np 2] [--steps 8]
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
TEXT = "/usr/share/games/fortunes/cookie"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
ENV.setdefault("EPL_STDLIB", os.path.join(HERE, "..", "stdlib"))
WARMUP = 2

TRAIN = f"""train gpt {{
  data = text("{TEXT}", seq = 128)
  batch = 32
  optimizer = adamw(lr = 3e-4)
  steps = 1000
  log_every = 1000
  eval = none
}}
"""

DATA_PARALLEL = """import "std/nn.epl"
model gpt(tokens: i32[B, 128]) {
  x = embedding(tokens, 256, 256) + positions(128, 256)
  x = repeat(6) transformer_block(x, 8)
  return cross_entropy(linear(layer_norm(x), 256), next(tokens))
}
""" + TRAIN

PIPELINE = """import "std/nn.epl"
model gpt(tokens: i32[B, 128]) {
  replicate {
    x = embedding(tokens, 256, 256) + positions(128, 256)
    x = repeat(3) transformer_block(x, 8)
  }
  replicate {
    x = repeat(3) transformer_block(x, 8)
    loss = cross_entropy(linear(layer_norm(x), 256), next(tokens))
  }
  return loss
}
policy { micro_batches = 4 schedule = 1f1b }
""" + TRAIN

# The blocks split 2 ways (attention heads, mlp hidden width), in two data-parallel copies
# at -np 4: ZeRO partitions the embedding and head over the 4 ranks, the blocks' pieces
# over the 2 copies.
SPLIT = """import "std/nn.epl"
model gpt(tokens: i32[B, 128]) {
  replicate {
    x = embedding(tokens, 256, 256) + positions(128, 256)
    split(2) { x = repeat(6) transformer_block(x, 8) }
    loss = cross_entropy(linear(layer_norm(x), 256), next(tokens))
  }
  return loss
}
""" + TRAIN

UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def size(text):
    number, unit = text.split()
    return float(number) * UNITS[unit]


def run(args, work, name, script, np, settings):
    path = os.path.join(work, f"{name}.epl")
    with open(path, "w") as f:
        f.write(script)
    metrics = os.path.join(work, f"{name}.jsonl")
    cmd = [args.epl, "run", path, "-np", str(np), "--threads", "1", "--steps", str(args.steps),
           "--metrics", metrics]
    for s in settings:
        cmd += ["--set", s]
    out = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
    text = out.stdout + out.stderr
    if "is not applied" in text:
        sys.exit(f"{' '.join(cmd)}: a policy was not applied:\n{text}")
    plan = re.search(r"memory plan (\S+ \S+) per rank \(activations (\S+ \S+|\S+ slots x \S+ \S+)"
                     r"(?: \+ receive buffers \S+ \S+)?(?: with kernel workspaces up to \S+ \S+)?"
                     r", params (\S+ \S+), grads (\S+ \S+), "
                     r"optimizer (\S+ \S+)(?:, staging \S+ \S+)?(?:, comm buffers (\S+ \S+))?"
                     r"(?:, host inputs \S+ \S+)?\)", text)
    # Stage 0's ranks (rank 0's stage), the highest of them.
    measured = re.search(r"memory after the first step.*?planned [^,]*, "
                         r"measured (?:\S+ \S+ to )?(\S+ \S+) \(", text)
    if not plan or not measured:
        sys.exit(f"no memory figures in the output of {' '.join(cmd)}:\n{text}")
    activations = plan.group(2)
    slots = re.match(r"(\d+) slots x (.*)", activations)
    acts = int(slots.group(1)) * size(slots.group(2)) if slots else size(activations)
    states = size(plan.group(3)) + size(plan.group(4)) + size(plan.group(5))
    comm = size(plan.group(6)) if plan.group(6) else 0
    staging = re.search(r"streamed through (\S+ \S+) of staging buffers", text)
    if staging:
        states += size(staging.group(1))
    rows = [json.loads(l) for l in open(metrics)]
    steps = [r["step_seconds"] for r in rows if "step_seconds" in r]
    return {"plan": size(plan.group(1)), "activations": acts, "states": states, "comm": comm,
            "measured": size(measured.group(1)), "step": statistics.median(steps[WARMUP:])}


def mb(v):
    return f"{v / 1e6:7.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epl", default=os.path.join(HERE, "..", "build", "epl"))
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    cases = [
        (f"data-parallel -np {args.np}", DATA_PARALLEL, args.np, [
            ("none", []),
            ("recompute = every", ["policy.recompute=every"]),
            ("zero = 1", ["policy.zero=1"]),
            ("both", ["policy.recompute=every", "policy.zero=1"]),
            ("zero = 2", ["policy.zero=2"]),
            ("zero 2 + recompute", ["policy.recompute=every", "policy.zero=2"]),
            ("zero = 3", ["policy.zero=3"]),
            ("zero 3 + recompute", ["policy.recompute=every", "policy.zero=3"]),
            ("offload to disk", ["policy.offload=optimizer", "policy.offload_to=disk"]),
            ("all three", ["policy.recompute=every", "policy.zero=1", "policy.offload=optimizer",
                           "policy.offload_to=disk"]),
            ("amp = bf16", ["policy.amp=bf16"]),
            ("amp fp16 + zero 2", ["policy.amp=fp16", "policy.zero=2"]),
        ]),
        ("2 stages -np 2", PIPELINE, 2, [
            ("none", []),
            ("recompute = every", ["policy.recompute=every"]),
            ("amp = bf16", ["policy.amp=bf16"]),
        ]),
        # Two data-parallel copies of the pipeline: ZeRO partitions each stage over them.
        # On fewer than 4 cores the ranks share them: its step times are not comparable.
        ("2 stages x 2 -np 4", PIPELINE, 4, [
            ("none", []),
            ("zero = 3", ["policy.zero=3"]),
        ]),
        ("split(2) x 2 -np 4", SPLIT, 4, [
            ("none", []),
            ("zero = 2", ["policy.zero=2"]),
            ("zero = 3", ["policy.zero=3"]),
        ]),
    ]
    print(f"memory policies on the char-GPT (6 blocks, d 256, seq 128, batch 32, adamw), "
          f"{os.cpu_count()} cores, 1 thread a rank; rank 0's figures in MB; median step of "
          f"{args.steps - WARMUP} after {WARMUP} warm-up")
    print(f"{'plan':22} {'policy':18} {'activ.':>7} {'states':>7} {'comm':>6} {'planned':>7} "
          f"{'measured':>8} {'meas/plan':>9} {'step s':>7}   against none")
    with tempfile.TemporaryDirectory() as work:
        for title, script, np, policies in cases:
            base = None
            results = {}
            k = 0

            def row(name, settings):
                nonlocal base, k
                r = run(args, work, f"{np}_{k}_{len(title)}", script, np, settings)
                base = base or r
                against = "" if r is base else (
                    f"activations / {base['activations'] / r['activations']:.2f}, "
                    f"states / {base['states'] / r['states']:.2f}, "
                    f"measured / {base['measured'] / r['measured']:.2f}, "
                    f"step x {r['step'] / base['step']:.2f}")
                print(f"{title if k == 0 else '':22} {name:18} {mb(r['activations'])} "
                      f"{mb(r['states'])} {r['comm'] / 1e6:6.1f} {mb(r['plan'])} "
                      f"{mb(r['measured']):>8} {r['measured'] / r['plan']:9.2f} "
                      f"{r['step']:7.3f}   {against}", flush=True)
                results[name] = r
                k += 1
                return r

            for name, settings in policies:
                row(name, settings)
            # recompute = auto against every under one budget: halfway between the plans
            # without recompute and with every block recomputed.
            every = results.get("recompute = every")
            if every and base:
                budget = int((base["plan"] + every["plan"]) / 2e6)
                auto = row(f"auto, {budget} MB", ["policy.recompute=auto",
                                                  f"policy.device_memory={budget}MB"])
                fixed = row(f"every, {budget} MB", ["policy.recompute=every",
                                                    f"policy.device_memory={budget}MB"])
                print(f"{'':22} {'':18} under {budget} MB: auto's step / every's = "
                      f"{auto['step'] / fixed['step']:.2f}, planned {mb(auto['plan'])} vs "
                      f"{mb(fixed['plan'])} MB")
    print("targets: recompute cuts activations >= 2x for <= 1.4x the step; auto under a "
          "budget no slower than every; measured within 10% of planned; at -np 4, zero = 3 "
          "cuts the model states >= 3.5x")


if __name__ == "__main__":
    main()
