"""What the GPU benchmarks (gpt2.py, small.py) share: step timings, EPL's from its metrics
file and a PyTorch loop's between device synchronisations, both the median after the
warm-up steps; and the PyTorch twin of std/nn.epl's transformer_block."""
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def epl_steps(epl, script, steps, warmup, sets=(), device="cuda", env=None):
    """`epl run SCRIPT --device DEVICE` for warmup + steps steps with `--set` each of sets
    (and the variables of env beside the environment's): (median step seconds after the
    warm-up, the run's first line, every step's loss, its line comparing the step with the
    cost model's prediction or ""), or None after printing why it failed."""
    epl = os.path.abspath(epl)  # the run's folder is a temporary one
    with tempfile.TemporaryDirectory() as work:
        metrics = os.path.join(work, "m.jsonl")
        cmd = [epl, "run", script, "--device", device, "--steps", str(warmup + steps),
               "--metrics", metrics]
        for s in sets:
            cmd += ["--set", s]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=work,
                           env=dict(os.environ, **(env or {})))
        if r.returncode != 0:
            print(f"EPL failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}", flush=True)
            return None
        recs = [json.loads(line) for line in open(metrics)]
        times = [x["step_seconds"] for x in recs if "step_seconds" in x]
        losses = [x["loss"] for x in recs if "step_seconds" in x]
        first = r.stdout.splitlines()[0] if r.stdout else ""
        predicted = next((line.strip() for line in r.stdout.splitlines()
                          if line.strip().startswith("step time:")), "")
        return statistics.median(times[warmup:]), first, losses, predicted


def torch_steps(step, steps, warmup):
    """The median seconds of step() after the warm-up, each timed between synchronisations."""
    times = []
    for _ in range(warmup + steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times[warmup:])


# std/nn.epl's transformer_block: pre-norm attention (fused qkv, causal) and a 4x tanh-GELU
# feed-forward, attention through PyTorch's fastest kernel.
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
