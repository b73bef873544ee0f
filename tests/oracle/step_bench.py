#!/usr/bin/python3
"""Times one training step of the layers epl_step_bench runs, in PyTorch eager (fp32), and
the kernels' step through the probe benchmark, and prints the ratio. Not a test.

Usage: step_bench.py PATH/TO/epl_step_bench [gpt|mlp] [steps] [threads]
Shape legend: B batch, T time, D width, H heads, V vocab, L layers.
"""
import math
import re
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        y = F.softmax(s, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, D))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab=256, d=256, heads=8, layers=6, seq=128):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens, targets):
        x = self.emb(tokens) + self.pos
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(784, 256), nn.Linear(256, 256), nn.Linear(256, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.l3(F.relu(self.l2(F.relu(self.l1(x))))), y)


def torch_step_ms(which, steps):
    if which == "gpt":
        model, inputs = Gpt(), (torch.randint(0, 256, (32, 128)), torch.randint(0, 256, (32, 128)))
    else:
        model, inputs = Mlp(), (torch.randn(128, 784), torch.randint(0, 10, (128,)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    times, cpu = [], []
    for i in range(steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        model(*inputs).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return 1000 * min(times[1:]), 1000 * min(cpu[1:])


def main():
    exe = sys.argv[1]
    which = sys.argv[2] if len(sys.argv) > 2 else "gpt"
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    torch.set_num_threads(threads)
    ours, theirs = [], []
    for _ in range(3):  # interleaved, so both see the same machine load
        out = subprocess.run([exe, which, str(steps), str(threads)], capture_output=True,
                             text=True, check=True).stdout
        m = re.search(r"step: ([0-9.]+) ms best.*cpu ([0-9.]+) ms", out)
        ours.append((float(m.group(1)), float(m.group(2))))
        theirs.append(torch_step_ms(which, steps))
    wall, cpu = min(o[0] for o in ours), min(o[1] for o in ours)
    twall, tcpu = min(t[0] for t in theirs), min(t[1] for t in theirs)
    print("%s step, %d threads: kernels %.1f ms (cpu %.1f), torch %.1f ms (cpu %.1f); "
          "ratio wall %.2f, cpu %.2f (best of runs)" %
          (which, threads, wall, cpu, twall, tcpu, wall / twall, cpu / tcpu))


if __name__ == "__main__":
    main()
