#!/usr/bin/python3
"""Data parallelism on 2 ranks: EPL vs PyTorch DDP, overlap, and reduction bandwidth.

1. One training step of the char-GPT (6 layers, d 256, 8 heads, seq 128, global batch 32,
   AdamW) with `epl run -np 2` (mpirun, 1 thread a rank) vs PyTorch 1.13 DDP with gloo in
   2 processes (1 thread each, 16 samples each). Median step time after warm-up, and the
   ratio. Target: EPL / PyTorch <= 0.8.
2. Overlap: the same EPL run with `overlap_comm = true` vs `false` (4 MB buckets, so
   there is something to overlap): step time and the time blocked on reductions.
3. Bandwidth: with `overlap_comm = false` every bucket is reduced after the backward, so
   the time blocked is the reduction's time; bytes / time is its effective bandwidth,
   compared with raw MPI_Allreduce calls of the same bucket sizes (bench/allreduce).
   Target: >= 0.9.

usage: bench/data_parallel.py [--epl build/epl] [--allreduce build/bench/epl_bench_allreduce]
                              [--steps 10]
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
ENV = dict(os.environ, EPL_STDLIB=os.path.join(HERE, "..", "stdlib"),
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
WARMUP = 2

GPT = f"""
    import "std/nn.epl"
    model gpt(tokens: i32[B, 128]) {{
      replicate {{
        x = embedding(tokens, 256, 256) + positions(128, 256)
        x = repeat(6) transformer_block(x, 8)
        loss = cross_entropy(linear(layer_norm(x), 256), next(tokens))
      }}
      return loss
    }}
    train gpt {{
      data = text("{TEXT}", seq = 128)
      batch = 32
      optimizer = adamw(lr = 3e-4)
      steps = 1000
      log_every = 1000
    }}
    """

# The same model under torch.nn.parallel.DistributedDataParallel, one process a rank.
DDP = r"""
import json, os, sys, time
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
rank, world, steps, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, sys.argv[6])
from torch_gpt import Gpt, windows
torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world)

V, T, B = 256, 128, 32 // world
data = torch.tensor(list(open(sys.argv[5], "rb").read()), dtype=torch.long)
model = nn.parallel.DistributedDataParallel(Gpt())
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
times = []
for i in range(steps):
    t0 = time.perf_counter()
    x, y = windows(data, (i * world + rank) * B, B, T)
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    loss.backward()
    opt.step()
    loss.item()
    times.append(time.perf_counter() - t0)
if rank == 0:
    print(json.dumps({"times": times}))
dist.destroy_process_group()
"""


def epl_run(args, work, name, sets):
    script = os.path.join(work, "gpt.epl")
    with open(script, "w") as f:
        f.write(textwrap.dedent(GPT))
    metrics = os.path.join(work, f"{name}.jsonl")
    cmd = [args.epl, "run", script, "-np", "2", "--steps", str(args.steps), "--metrics", metrics]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, env=ENV, check=True, capture_output=True)
    rows = [json.loads(l) for l in open(metrics) if "step_seconds" in l][WARMUP:]
    return {
        "step": statistics.median(r["step_seconds"] for r in rows),
        "wait": statistics.median(r["reduce_wait_seconds"] for r in rows),
        # From the last rank's first reduction start to the last rank's last wait.
        "comm": statistics.median(r["reduce_span_seconds"] for r in rows),
        "bytes": rows[0]["reduce_bytes"],
    }


def ddp_run(args, work):
    py = os.path.join(work, "ddp.py")
    with open(py, "w") as f:
        f.write(DDP)
    port = str(29500 + os.getpid() % 1000)
    procs = [subprocess.Popen(["/usr/bin/python3", py, str(r), "2", str(args.steps), port, TEXT,
                               HERE],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("the DDP run failed")
    return statistics.median(json.loads(outs[0])["times"][WARMUP:])


def raw_allreduce(args, nbytes):
    """Median seconds of one raw MPI_Allreduce of `nbytes` of floats on 2 ranks."""
    cmd = ["mpirun", "-np", "2", args.allreduce, "--raw-bytes", str(nbytes)]
    out = subprocess.run(cmd, env=ENV, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epl", default=os.path.join(HERE, "..", "build", "epl"))
    ap.add_argument("--allreduce",
                    default=os.path.join(HERE, "..", "build", "bench", "epl_bench_allreduce"))
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    buckets = ["policy.bucket_mb=4"]
    with tempfile.TemporaryDirectory() as work:
        print(f"char-GPT, global batch 32, 2 ranks x 1 thread, median of {args.steps - WARMUP} "
              f"steps after {WARMUP} warm-up steps\n")
        ours = epl_run(args, work, "default", [])
        theirs = ddp_run(args, work)
        print("1. EPL -np 2 vs PyTorch DDP (gloo, 2 processes)")
        print(f"   epl {ours['step'] * 1e3:.1f} ms   ddp {theirs * 1e3:.1f} ms   "
              f"ratio {ours['step'] / theirs:.3f}   (target <= 0.8)\n")
        on = epl_run(args, work, "overlap", buckets)
        off = epl_run(args, work, "after", buckets + ["policy.overlap_comm=false"])
        print("2. overlap (4 MB buckets)")
        print(f"   overlap_comm = true : step {on['step'] * 1e3:.1f} ms, blocked on "
              f"reductions {on['wait'] * 1e3:.1f} ms")
        print(f"   overlap_comm = false: step {off['step'] * 1e3:.1f} ms, blocked on "
              f"reductions {off['wait'] * 1e3:.1f} ms")
        print(f"   step time ratio overlap/after {on['step'] / off['step']:.3f}\n")
        one = epl_run(args, work, "one", ["policy.overlap_comm=false"])
        raw = raw_allreduce(args, one["bytes"])
        print("3. reduction bandwidth during a step (overlap_comm = false, so the reductions")
        print("   run alone; time = from the last rank's first start to the last rank's end)")
        for name, r in (("one 25 MB bucket", one), ("4 MB buckets", off)):
            print(f"   {name:17}: {r['bytes'] / 1e6:.1f} MB in {r['comm'] * 1e3:.1f} ms, "
                  f"{r['bytes'] / r['comm'] / 1e9:.2f} GB/s, ratio to raw "
                  f"{raw / r['comm']:.3f}")
        print(f"   one raw MPI_Allreduce of the same bytes: {raw * 1e3:.1f} ms, "
              f"{one['bytes'] / raw / 1e9:.2f} GB/s   (target: ratio >= 0.9)")


if __name__ == "__main__":
    main()
