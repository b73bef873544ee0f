#!/usr/bin/python3
"""One training step, EPL vs PyTorch eager, on the same model, batch, data and threads.

Runs `epl run` on a char-GPT (6 layers, d 256, 8 heads, seq 128, batch 32, AdamW) and on
the Fashion-MNIST MLP (784-256-256-10, batch 128, Adam), then the same models written in
plain PyTorch 1.13 (Debian's python3-torch) in a separate process with the same thread
count. Prints the median step time of each (after warm-up steps), the peak resident
memory of each process, and the ratios. Targets: time ratio <= 0.8, memory ratio <= 1.0.

usage: bench/train_step.py [--epl build/epl] [--threads 2] [--steps 12] [gpt|mlp ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = "/usr/share/games/fortunes/cookie"
FASHION = "/usr/share/datasets/fashion-mnist"

SCRIPTS = {
    "gpt": f"""
        import "std/nn.epl"
        model gpt(tokens: i32[B, 128]) {{
          x = embedding(tokens, 256, 256) + positions(128, 256)
          x = repeat(6) transformer_block(x, 8)
          return cross_entropy(linear(layer_norm(x), 256), next(tokens))
        }}
        train gpt {{
          data = text("{TEXT}", seq = 128)
          batch = 32
          optimizer = adamw(lr = 3e-4)
          steps = 1000
          log_every = 1000
        }}
        """,
    "mlp": f"""
        model net(images: f32[B, 1, 28, 28], labels: i32[B]) {{
          x = relu(linear(flatten(images), 256))
          x = relu(linear(x, 256))
          return cross_entropy(linear(x, 10), labels)
        }}
        train net {{
          data = idx("{FASHION}/train-images-idx3-ubyte.gz", "{FASHION}/train-labels-idx1-ubyte.gz")
          batch = 128
          optimizer = adam(lr = 1e-3)
          steps = 100000
          log_every = 100000
        }}
        """,
}

# The same models in PyTorch, timed step by step in their own process.
TORCH = r"""
import gzip, json, math, resource, statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
case, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

if case == "gpt":
    sys.path.insert(0, sys.argv[5])
    from torch_gpt import Gpt, windows
    V, T, B = 256, 128, 32
    data = torch.tensor(list(open(sys.argv[4], "rb").read()), dtype=torch.long)
    model = Gpt(V, T)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    def batch(i): return windows(data, i * B, B, T)
    def loss_of(x, y): return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
else:
    B = 128
    raw = gzip.open(sys.argv[4], "rb").read()[16:]
    lab = gzip.open(sys.argv[5], "rb").read()[8:]
    images = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(-1, 784)
    labels = torch.frombuffer(bytearray(lab), dtype=torch.uint8).long()
    net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    def batch(i):
        idx = torch.randint(0, images.shape[0], (B,))
        return images[idx].float() / 255, labels[idx]
    def loss_of(x, y): return F.cross_entropy(net(x), y)

times = []
for i in range(steps):
    t0 = time.perf_counter()
    x, y = batch(i)
    opt.zero_grad(set_to_none=True)
    loss = loss_of(x, y)
    loss.backward()
    opt.step()
    loss.item()
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "rss_import": rss_import}))
"""


def peak_rss(cmd, env=None):
    """Runs cmd and returns (stdout, peak resident bytes) via wait4's rusage."""
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execvpe(cmd[0], cmd, env or os.environ)
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"{cmd} failed with status {status}")
    return usage.ru_maxrss * 1024


def median_after_warmup(times, warmup):
    return statistics.median(times[warmup:])


def bench(case, args, work):
    script = os.path.join(work, f"{case}.epl")
    with open(script, "w") as f:
        f.write(textwrap.dedent(SCRIPTS[case]))
    metrics = os.path.join(work, f"{case}.jsonl")
    env = dict(os.environ, EPL_STDLIB=os.path.join(HERE, "..", "stdlib"))
    cmd = [args.epl, "run", script, "--steps", str(args.steps), "--threads", str(args.threads),
           "--metrics", metrics]
    ours_rss = peak_rss(cmd, env)
    rows = [json.loads(l) for l in open(metrics)]
    ours = median_after_warmup([r["step_seconds"] for r in rows if "step_seconds" in r], 2)

    torch_py = os.path.join(work, "torch_step.py")
    with open(torch_py, "w") as f:
        f.write(TORCH)
    extra = [TEXT, HERE] if case == "gpt" else [f"{FASHION}/train-images-idx3-ubyte.gz",
                                          f"{FASHION}/train-labels-idx1-ubyte.gz"]
    tcmd = ["/usr/bin/python3", torch_py, case, str(args.steps), str(args.threads)] + extra
    out = subprocess.run(tcmd, capture_output=True, text=True, check=True).stdout
    res = json.loads(out)
    theirs = median_after_warmup(res["times"], 2)
    theirs_rss = peak_rss(tcmd)
    return ours, theirs, ours_rss, theirs_rss, res["rss_import"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=["gpt", "mlp"])
    ap.add_argument("--epl", default=os.path.join(HERE, "..", "build", "epl"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    print(f"one training step, fp32, {args.threads} threads, median of {args.steps - 2} steps "
          f"after 2 warm-up steps")
    print(f"{'model':6} {'epl ms':>9} {'torch ms':>9} {'time ratio':>10}   "
          f"{'epl RSS':>9} {'torch RSS':>9} {'mem ratio':>9}")
    with tempfile.TemporaryDirectory() as work:
        for case in args.cases:
            ours, theirs, ors, trs, timport = bench(case, args, work)
            print(f"{case:6} {ours * 1e3:9.1f} {theirs * 1e3:9.1f} {ours / theirs:10.3f}   "
                  f"{ors / 2**20:8.0f}M {trs / 2**20:8.0f}M {ors / trs:9.3f}")
            print(f"{'':6} (torch process after `import torch`, before the model: "
                  f"{timport / 2**20:.0f}M)")
    print("targets: time ratio <= 0.8, memory ratio <= 1.0")


if __name__ == "__main__":
    main()
