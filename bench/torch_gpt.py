"""The char-GPT of the benchmarks in plain PyTorch: the same blocks as EPL's
std/nn.epl transformer_block (pre-norm attention and a 4x GELU feed-forward, tanh GELU),
an embedding plus learned positions, and a final layer norm and head."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        # A plain attribute, not a buffer: gloo (DDP) cannot broadcast bool tensors.
        self.mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        a = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.h)
        a = a.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab=256, seq=128, d=256, heads=8, layers=6):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, seq) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x):
        h = self.emb(x) + self.pos
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln(h))


def windows(data, first, count, seq):
    """`count` windows of seq + 1 tokens, the i-th starting at window first + i."""
    starts = [(first + j) * seq % (len(data) - seq - 1) for j in range(count)]
    w = torch.stack([data[s:s + seq + 1] for s in starts])
    return w[:, :-1], w[:, 1:]
