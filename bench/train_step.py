#!/usr/bin/python3
"""One training step, EPL vs PyTorch eager, on the same model, batch and data.

Runs `epl run` on a char-GPT (6 layers, d 256, 8 heads, seq 128, batch 32, AdamW) and on
the Fashion-MNIST MLP (784-256-256-10, batch 128, Adam), and (`cnn`, not by default) the
Fashion-MNIST CNN of examples/cnn_fashion.epl (batch 64, Adam), at 1 thread and at N (the
machine's cores), and the same models written in plain PyTorch 1.13 (Debian's
python3-torch), each in its own process, in PyTorch's three configurations on the same
cores: 1 thread, N threads, and N threads with OMP_WAIT_POLICY=PASSIVE (its OpenMP
workers otherwise spin, and fight over few cores). EPL at t threads is compared with the
best PyTorch configuration of at most t threads.

Also the BLAS limit: the step's FLOPs (6 x parameters per token, plus 12 x layers x d x
seq for attention) over OpenBLAS's sgemm rate on 2048^3 at the same thread count (issue
17's definition), and over the faster of OpenBLAS's and oneDNN's rates (EPL runs big GEMM
pieces through oneDNN where it is built with it, so this is the stricter bound: the step's
products alone come near it), both measured in the same run; and EPL's step as a share of
each.

`gpt_amp` is the char-GPT under mixed precision: EPL's `amp = bf16` against PyTorch's
`torch.autocast("cpu", dtype=torch.bfloat16)` around the forward and the loss (both keep
f32 weights and optimizer); its limit columns are the fp32 sgemm's, for scale only.

Prints the median step time of each (after 2 warm-up steps), the peak resident memory of
each process, and the ratios. Targets (issue 17): EPL <= 0.8 x the best PyTorch at every
thread count, >= 90% of the OpenBLAS limit, memory ratio <= 1.0.

usage: bench/train_step.py [--epl build/epl] [--threads N] [--steps 12] [--mlp-steps 200]
       [--cnn-steps 40] [gpt|gpt_amp|mlp|cnn ...]
"""
import argparse
import array
import ctypes
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

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
    "cnn": f"""
        import "std/nn.epl"
        model cnn(images: f32[B, 1, 28, 28], labels: i32[B]) {{
          x = max_pool(relu(conv2d(images, 32, 3, padding = 1)), 2)
          x = resnet_block(x)
          x = max_pool(relu(conv2d(x, 64, 3, padding = 1)), 2)
          x = relu(linear(flatten(x), 128))
          return cross_entropy(linear(dropout(x, p = 0.25), 10), labels)
        }}
        train cnn {{
          data = idx("{FASHION}/train-images-idx3-ubyte.gz", "{FASHION}/train-labels-idx1-ubyte.gz")
          batch = 64
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

if case in ("gpt", "gpt_amp"):
    sys.path.insert(0, sys.argv[5])
    from torch_gpt import Gpt, windows
    V, T, B = 256, 128, 32
    data = torch.tensor(list(open(sys.argv[4], "rb").read()), dtype=torch.long)
    model = Gpt(V, T)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    def batch(i): return windows(data, i * B, B, T)
    def loss_of(x, y):
        if case == "gpt":
            return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.cross_entropy(model(x).reshape(-1, V).float(), y.reshape(-1))
else:
    B = 128 if case == "mlp" else 64
    raw = gzip.open(sys.argv[4], "rb").read()[16:]
    lab = gzip.open(sys.argv[5], "rb").read()[8:]
    images = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(-1, 784)
    labels = torch.frombuffer(bytearray(lab), dtype=torch.uint8).long()
    if case == "mlp":
        net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                            nn.Linear(256, 10))
    else:  # examples/cnn_fashion.epl: std/nn.epl's resnet_block between the two stages
        class Cnn(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.r1 = nn.Conv2d(1, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1)
                self.r2, self.c2 = nn.Conv2d(32, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1)
                self.l1, self.l2 = nn.Linear(64 * 7 * 7, 128), nn.Linear(128, 10)
            def forward(self, x):
                x = F.max_pool2d(F.relu(self.c1(x.reshape(-1, 1, 28, 28))), 2)
                x = F.relu(x + self.r2(F.relu(self.r1(x))))
                x = F.max_pool2d(F.relu(self.c2(x)), 2)
                x = F.relu(self.l1(x.flatten(1)))
                return self.l2(F.dropout(x, 0.25, self.training))
        net = Cnn()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    def batch(i):
        idx = torch.randint(0, images.shape[0], (B,))
        return images[idx].float() / 255, labels[idx]
    def loss_of(x, y): return F.cross_entropy(net(x), y)

times, cpu = [], []
for i in range(steps):
    t0, c0 = time.perf_counter(), time.process_time()
    x, y = batch(i)
    opt.zero_grad(set_to_none=True)
    loss = loss_of(x, y)
    loss.backward()
    opt.step()
    loss.item()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
params = sum(p.numel() for p in (net if case in ("mlp", "cnn") else model).parameters())
print(json.dumps({"times": times, "cpu": cpu, "rss_import": rss_import, "params": params,
                  "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def peak_rss_and_cores(cmd, env=None):
    """Runs cmd and returns its peak resident bytes and the cores it kept busy on average (CPU
    seconds over wall seconds, start-up included), from wait4's rusage."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execvpe(cmd[0], cmd, env or os.environ)
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"{cmd} failed with status {status}")
    cores = (usage.ru_utime + usage.ru_stime) / (time.perf_counter() - start)
    return usage.ru_maxrss * 1024, cores


def steps_of(case, args):
    """Steps to run: the MLP's take milliseconds, and a handful of them gives no stable median
    (its first steps at 2 threads still fault in pages and wake threads); the CNN's tens."""
    return {"mlp": args.mlp_steps, "cnn": args.cnn_steps}.get(case, args.steps)


def median_after_warmup(times, warmup):
    return statistics.median(times[warmup:])


def epl_step(case, args, work, threads):
    """EPL's median step seconds, peak resident bytes and busy cores at `threads`."""
    script = os.path.join(work, f"{case}.epl")
    with open(script, "w") as f:
        f.write(textwrap.dedent(SCRIPTS["gpt" if case == "gpt_amp" else case]))
    metrics = os.path.join(work, f"{case}.{threads}.jsonl")
    env = dict(os.environ, EPL_STDLIB=os.path.join(HERE, "..", "stdlib"))
    cmd = [args.epl, "run", script, "--steps", str(steps_of(case, args)), "--threads", str(threads),
           "--metrics", metrics] + (["--set", "policy.amp=bf16"] if case == "gpt_amp" else [])
    rss, cores = peak_rss_and_cores(cmd, env)
    rows = [json.loads(l) for l in open(metrics)]
    seconds = median_after_warmup([r["step_seconds"] for r in rows if "step_seconds" in r], 2)
    return seconds, rss, cores


def torch_step(case, args, work, threads, passive):
    """PyTorch's median step seconds, its result (params, resident bytes) at `threads`."""
    torch_py = os.path.join(work, "torch_step.py")
    with open(torch_py, "w") as f:
        f.write(TORCH)
    extra = [TEXT, HERE] if case not in ("mlp", "cnn") else [
        f"{FASHION}/train-images-idx3-ubyte.gz", f"{FASHION}/train-labels-idx1-ubyte.gz"]
    # torch.set_num_threads sets its OpenMP threads only: Debian's PyTorch reaches OpenBLAS
    # through the generic BLAS interface, whose pthreads pool would take every core even in
    # the 1-thread configuration (4.1 s of CPU in a 2.1 s step on 2 cores).
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    tcmd = ["/usr/bin/python3", torch_py, case, str(steps_of(case, args)), str(threads)] + extra
    out = subprocess.run(tcmd, capture_output=True, text=True, check=True, env=env).stdout
    res = json.loads(out)
    res["cores"] = sum(res["cpu"][2:]) / sum(res["times"][2:])
    return median_after_warmup(res["times"], 2), res


def sgemm_rate(threads, library, n=2048):
    """sgemm FLOP/s on n^3 at `threads` through `library` ("OpenBLAS" or "oneDNN"): the best
    of three after a warm-up; None when the library is not installed."""
    # Not zeros (a BLAS may take shortcuts on them): a repeated pattern of 8 values.
    pattern = array.array("f", [1.0 + i / 8 for i in range(8)]) * (n * n // 8)
    a, b, c = ((ctypes.c_float * (n * n)).from_buffer(array.array("f", pattern))
               for _ in range(3))
    if library == "OpenBLAS":
        lib = ctypes.CDLL(ctypes.util.find_library("openblas") or "libopenblas.so.0")
        lib.openblas_set_num_threads(threads)
        def run():  # row major, no transposes
            lib.cblas_sgemm(101, 111, 111, n, n, n, ctypes.c_float(1), a, n, b, n,
                            ctypes.c_float(0), c, n)
    else:
        try:
            lib = ctypes.CDLL("libdnnl.so.2")
            ctypes.CDLL("libgomp.so.1").omp_set_num_threads(threads)  # oneDNN's OpenMP
        except OSError:
            return None
        dim, fp = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
        lib.dnnl_sgemm.argtypes = [ctypes.c_char, ctypes.c_char, dim, dim, dim, ctypes.c_float,
                                   fp, dim, fp, dim, ctypes.c_float, fp, dim]
        def run():  # row major, no transposes
            ptr = lambda x: ctypes.cast(x, fp)
            status = lib.dnnl_sgemm(b"N", b"N", n, n, n, 1.0, ptr(a), n, ptr(b), n, 0.0, ptr(c), n)
            assert status == 0, f"dnnl_sgemm failed: {status}"
    best = None
    for _ in range(4):
        t0 = time.perf_counter()
        run()
        t = time.perf_counter() - t0
        best = t if best is None or t < best else best
    return 2.0 * n ** 3 / best


def step_flops(case, params):
    """A training step's FLOPs: 6 per parameter and token (or sample), plus attention's
    12 x layers x d x seq per token for the GPT's attention (PaLM's count, the causal
    half included)."""
    if case in ("gpt", "gpt_amp"):
        tokens = 32 * 128
        return tokens * (6 * params + 12 * 6 * 256 * 128)
    if case == "cnn":  # a convolution's products per sample: 2 x C K K x Co x Ho Wo
        conv = 2 * (9 * 32 * 784 + 2 * 288 * 32 * 196 + 288 * 64 * 196)
        return 64 * (3 * conv + 6 * (3136 * 128 + 128 * 10))
    return 128 * 6 * params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=["gpt", "mlp"])
    ap.add_argument("--epl", default=os.path.join(HERE, "..", "build", "epl"))
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="N: EPL and PyTorch at 1 and N threads")
    ap.add_argument("--steps", type=int, default=12, help="steps of the GPT")
    ap.add_argument("--mlp-steps", type=int, default=200, help="steps of the MLP")
    ap.add_argument("--cnn-steps", type=int, default=40, help="steps of the CNN")
    args = ap.parse_args()
    counts = sorted({1, args.threads})
    print(f"one training step, fp32, median of {args.steps - 2} steps (the MLP: "
          f"{args.mlp_steps - 2}) after 2 warm-up steps, "
          f"{os.cpu_count()} cores; a configuration of t threads uses at most t cores")
    rates, openblas = {}, {}
    for library in ("OpenBLAS", "oneDNN"):
        found = {t: sgemm_rate(t, library) for t in counts}
        if None in found.values():
            print(f"{library} sgemm: not installed")
            continue
        print(f"{library} sgemm 2048^3: " +
              ", ".join(f"{found[t] / 1e9:.0f} GFLOP/s at {t} thread{'s' if t > 1 else ''}"
                        for t in counts))
        for t in counts:
            rates[t] = max(rates.get(t, 0), found[t])
        if library == "OpenBLAS":
            openblas = found
    with tempfile.TemporaryDirectory() as work:
        for case in args.cases:
            ours = {t: epl_step(case, args, work, t) for t in counts}
            peers = {}
            for t in counts:
                for passive in ([False, True] if t > 1 else [False]):
                    peers[(t, passive)] = torch_step(case, args, work, t, passive)
            params = peers[(1, False)][1]["params"]
            flops = step_flops(case, params)
            print(f"\n{case}: {params:,} parameters, {flops / 1e9:.1f} GFLOP a step")
            print("  PyTorch: " + ", ".join(
                f"{peers[k][0] * 1e3:.1f} ms at {k[0]} thread{'s' if k[0] > 1 else ''}"
                f"{' passive' if k[1] else ''} ({peers[k][1]['cores']:.2f} cores busy)"
                for k in peers))
            print("  EPL: " + ", ".join(
                f"{ours[t][2]:.2f} cores busy at {t} thread{'s' if t > 1 else ''} (the whole run)"
                for t in counts))
            print(f"  {'threads':>7} {'epl ms':>9} {'OpenBLAS limit':>14} {'of it':>6} "
                  f"{'fastest limit':>13} {'of it':>6} "
                  f"{'best torch ms':>13} {'(config)':>12} {'epl/torch':>9} "
                  f"{'epl RSS':>8} {'torch RSS':>9}")
            for t in counts:
                seconds, rss, _ = ours[t]
                limit = flops / rates[t]
                reference = flops / openblas[t]
                allowed = [k for k in peers if k[0] <= t]
                best = min(allowed, key=lambda k: peers[k][0])
                config = f"{best[0]}t{' passive' if best[1] else ''}"
                trss = peers[best][1]["rss_peak"]
                print(f"  {t:>7} {seconds * 1e3:9.1f} {reference * 1e3:11.1f} ms "
                      f"{reference / seconds:6.0%} {limit * 1e3:10.1f} ms {limit / seconds:6.0%} "
                      f"{peers[best][0] * 1e3:13.1f} {config:>12} {seconds / peers[best][0]:9.3f} "
                      f"{rss / 2**20:7.0f}M {trss / 2**20:8.0f}M")
    print("\ntargets: epl/torch <= 0.8 at every thread count; >= 90% of the OpenBLAS limit "
          "(the GPT); epl RSS <= torch RSS")


if __name__ == "__main__":
    main()
