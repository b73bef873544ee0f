#!/usr/bin/env python3
"""GPT-2 124M on one GPU: EPL against PyTorch on the same model, batch and GPU, one run.

EPL runs bench/gpu/gpt2_124m.epl with --device cuda: fp32 with its matrix products exact,
then on tensor cores in TF32 (`policy.matmul`), then that with `amp = bf16` (activations
stored in bf16; most of its CUDA kernels compute in f32 on widened copies so far), then
`amp = bf16` with fp32 products.
Attention's dot products run tiled on tensor cores, their scores in shared memory
(backend/cuda/FlashTiles.cuh); each run is also made with EPL_GPU_ATTENTION=scores, cuBLAS's
products over scores in device memory, to compare the two in the same run (step times and
losses). PyTorch runs the same model (pre-norm blocks, tanh GELU, tied head without bias,
AdamW, clipping at 1.0) eager in fp32 with TF32 off (EPL's arithmetic), eager with TF32,
eager under bf16 autocast, and, with --compile, torch.compile under bf16 autocast. Each
prints the median step time over the steps after the warm-up, tokens/s, and MFU:
6·N + 12·L·d·T FLOPs per token over the GPU's dense bf16 peak (989 TFLOP/s for an H100
or H200 SXM), the issue's measure whatever the precision.

usage: gpt2.py EPL [--batch 8] [--steps 12] [--warmup 3] [--compile] [--skip-epl]
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Block, epl_steps, torch_steps

VOCAB, D, HEADS, LAYERS, SEQ = 50304, 768, 12, 12, 1024
PEAK = 989e12


class Gpt2(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(SEQ, D) * 0.01)
        self.blocks = nn.ModuleList(Block(D, HEADS) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, x):
        h = self.emb(x[:, :-1]) + self.pos[: x.shape[1] - 1]
        for b in self.blocks:
            h = b(h)
        logits = F.linear(self.ln(h), self.emb.weight)
        return F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))


def params():
    return VOCAB * D + SEQ * D + LAYERS * (12 * D * D + 13 * D) + 2 * D


def flops_per_token():
    return 6 * params() + 12 * LAYERS * D * SEQ


def report(name, step_s, batch):
    tokens = batch * SEQ / step_s
    mfu = tokens * flops_per_token() / PEAK
    print(f"{name:34s} step {step_s * 1e3:8.1f} ms  {tokens:10,.0f} tokens/s  MFU {mfu:6.1%}",
          flush=True)
    return tokens


def torch_run(batch, steps, warmup, tf32, bf16, compile_):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    model = Gpt2().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    fwd = torch.compile(model) if compile_ else model
    data = torch.randint(0, VOCAB, (batch, SEQ + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(data)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    seconds = torch_steps(step, steps, warmup)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return seconds


def epl_run(epl, batch, steps, warmup, sets, env=None):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_124m.epl")
    run = epl_steps(epl, script, steps, warmup,
                    [f"train.batch={batch}"] + [f"policy.{s}" for s in sets], env=env)
    if not run:
        return None
    seconds, first, losses, predicted = run
    print(first, flush=True)
    print(f"EPL losses: {' '.join(f'{v:.4f}' for v in losses)}", flush=True)
    if predicted:  # the cost model's step on this GPU's built-in cluster (docs/cluster.md)
        print(predicted, flush=True)
    return seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("epl")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--skip-epl", action="store_true")
    a = ap.parse_args()
    print(f"GPT-2 124M ({params():,} parameters), batch {a.batch} x {SEQ} tokens, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    best = {}
    if not a.skip_epl:
        scores = {"EPL_GPU_ATTENTION": "scores"}
        # amp with fp32 products: the tiled path alone (its q, k and v exact in TF32).
        for sets in [["matmul=fp32"], ["matmul=tf32"], ["matmul=tf32", "amp=bf16"], ["amp=bf16"]]:
            for env in [None] if sets == ["amp=bf16"] else [None, scores]:
                name = "EPL " + " ".join(sets) + (" (scores)" if env else "")
                t = epl_run(a.epl, a.batch, a.steps, a.warmup, sets, env)
                if t:
                    best[name] = report(name, t, a.batch)
    for name, tf32, bf16, comp in [("PyTorch eager fp32 (no TF32)", False, False, False),
                                   ("PyTorch eager fp32 + TF32", True, False, False),
                                   ("PyTorch eager bf16 autocast", True, True, False),
                                   ("PyTorch compile bf16 autocast", True, True, True)]:
        if comp and not a.compile:
            continue
        best[name] = report(name, torch_run(a.batch, a.steps, a.warmup, tf32, bf16, comp),
                            a.batch)
    ours = [n for n in best if n.startswith("EPL")]
    for mine in ours:
        for name, tokens in best.items():
            if name not in ours:
                print(f"{mine} / {name}: {best[mine] / tokens:.2f} x the tokens/s")


if __name__ == "__main__":
    sys.exit(main())
