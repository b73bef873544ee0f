#!/usr/bin/env python3
"""Small models on one GPU, where launches rather than arithmetic set the pace: EPL against
PyTorch eager on the same model, batch and GPU, one run.

The char GPT of bench/train_step.py (6 blocks, d 256, 8 heads, seq 128, batch 32, AdamW,
on the tests' training text) and its MLP (784-256-256-10, batch 128, Adam, on synthetic
images). EPL runs each with --device cuda,
fp32 with exact products and with `matmul = tf32`; PyTorch runs the same models eager,
fp32 with TF32 off and on (its attention through scaled_dot_product_attention, its
optimizers fused). Prints the
median step time after the warm-up steps and the ratios.

usage: small.py EPL [--steps 30] [--warmup 5]
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Block, epl_steps, torch_steps

# The char GPT is bench/train_step.py's, on its training text (tools/gpu_check.sh puts the
# bundle's copy there); the MLP reads synthetic images.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from train_step import SCRIPTS as CPU_SCRIPTS  # noqa: E402

SCRIPTS = {
    "gpt": CPU_SCRIPTS["gpt"],
    "mlp": """
        model net(images: f32[B, 1, 28, 28], labels: i32[B]) {
          x = relu(linear(flatten(images), 256))
          x = relu(linear(x, 256))
          return cross_entropy(linear(x, 10), labels)
        }
        train net {
          data = synthetic(samples = 60000)
          batch = 128
          optimizer = adam(lr = 1e-3)
        }
        """,
}


class Gpt(nn.Module):
    def __init__(self, vocab=256, seq=128, d=256, heads=8, layers=6):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x):
        h = self.emb(x[:, :-1]) + self.pos[: x.shape[1] - 1]
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(self.head(self.ln(h)).flatten(0, 1), x[:, 1:].flatten())


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256),
                                 nn.ReLU(), nn.Linear(256, 10))

    def forward(self, xy):
        x, y = xy
        return F.cross_entropy(self.net(x), y)


def torch_step_seconds(name, steps, warmup, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    if name == "gpt":
        model = Gpt().cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        batch = torch.randint(0, 256, (32, 129), device="cuda")
    else:
        model = Mlp().cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        batch = (torch.randn(128, 1, 28, 28, device="cuda"),
                 torch.randint(0, 10, (128,), device="cuda"))

    def step():
        loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    return torch_steps(step, steps, warmup)


def epl_step_seconds(epl, name, steps, warmup, matmul):
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, f"{name}.epl")
        with open(script, "w") as f:
            f.write(SCRIPTS[name])
        run = epl_steps(epl, script, steps, warmup,
                        ["train.log_every=1", "train.eval=none", "train.checkpoint=none",
                         f"policy.matmul={matmul}"])
        return run[0] if run else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("epl")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name in ["gpt", "mlp"]:
        ours = {m: epl_step_seconds(a.epl, name, a.steps, a.warmup, m) for m in ["fp32", "tf32"]}
        theirs = {m: torch_step_seconds(name, a.steps, a.warmup, m == "tf32")
                  for m in ["fp32", "tf32"]}
        for m in ["fp32", "tf32"]:
            line = f"{name} {m}: PyTorch eager {theirs[m] * 1e3:7.2f} ms"
            if ours[m]:
                line += f", EPL {ours[m] * 1e3:7.2f} ms, EPL / PyTorch {ours[m] / theirs[m]:.2f} x the time"
            print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
