#!/usr/bin/python3
"""Ten training steps of EPL against PyTorch on identical weights and data.

EPL writes its initial weights as a safetensors checkpoint (`epl run --save-initial`);
this script reads them (by the safetensors spec, with json + torch.frombuffer: Debian 12
ships no python3-safetensors), builds the same model in plain PyTorch, trains it with
torch.optim on the same samples, and compares the loss of every step with EPL's metrics
file. Each step's batch is the whole (small) data set, so the sample order cannot differ.

usage: torch_training.py EPL WORKDIR {mlp,cnn_bn,resnet_bn,gpt,gpt_tied,llama,lines}
                         [--micro-batches N] [--optimizer KIND] [--clip NORM] [--ignore-index K]
(gpt_tied: the head shares the embedding's matrix, `tie = embedding`; --ignore-index: the
gpt's loss leaves out the targets of class K, its mean over the batch's kept targets;
lines: the gpt on a text's lines, padded, with padding masks from the data)
"""
import argparse
import gzip
import json
import math
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
FASHION = "/usr/share/datasets/fashion-mnist"
TOLERANCE = 1e-4  # relative, per step (issue: loss per step within 1e-4)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def write_idx_subset(src, dst, count):
    with gzip.open(src, "rb") as f:
        raw = f.read()
    magic, n = struct.unpack(">II", raw[:8])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, raw[4 : 4 + 4 * dims])
    per = 1
    for d in shape[1:]:
        per *= d
    head = struct.pack(">I", magic) + struct.pack(">I", count) + raw[8 : 4 + 4 * dims]
    body = raw[4 + 4 * dims : 4 + 4 * dims + count * per]
    with open(dst, "wb") as f:
        f.write(head + body)
    return body


OPTIMIZERS = {
    "adam": ("adam(lr = 1e-3)", lambda p: torch.optim.Adam(p, lr=1e-3)),
    "adamw": ("adamw(lr = 3e-3, weight_decay = 0.1)",
              lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.1)),
    "sgd": ("sgd(lr = 0.05, momentum = 0.9)",
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
}


def fashion_case(work, args, body, imports=""):
    """A classifier `net` whose `body` (EPL, reading `images` and `labels`; after `imports`)
    trains 10 steps on the first 256 Fashion-MNIST images as one batch; returns its script,
    the images [256, 784] and the labels."""
    n = 256
    imgs = write_idx_subset(f"{FASHION}/train-images-idx3-ubyte.gz", f"{work}/img.idx", n)
    labs = write_idx_subset(f"{FASHION}/train-labels-idx1-ubyte.gz", f"{work}/lab.idx", n)
    script = f"""{imports}
model net(images: f32[B, 1, 28, 28], labels: i32[B]) {{
{body}
}}
policy {{ micro_batches = {args.micro_batches} }}
train net {{
  data = idx("img.idx", "lab.idx", test_images = "img.idx", test_labels = "lab.idx")
  batch = {n}
  optimizer = {OPTIMIZERS[args.optimizer][0]}
  steps = 10
  clip_grad_norm = {args.clip}
  checkpoint = {{ dir = "ckpt", every = 100 }}
  seed = 3
}}
"""
    x = torch.tensor(list(imgs), dtype=torch.float32).reshape(n, 784) / 255.0
    y = torch.tensor(list(labs), dtype=torch.long)
    return script, x, y


def mlp_case(work, args):
    script, x, y = fashion_case(work, args, """\
  x = relu(linear(flatten(images), 64))
  x = relu(linear(x, 32))
  return cross_entropy(linear(x, 10), labels)""")

    def loss_fn(w):
        h = F.relu(F.linear(x, w["linear.weight"], w["linear.bias"]))
        h = F.relu(F.linear(h, w["linear.1.weight"], w["linear.1.bias"]))
        return F.cross_entropy(F.linear(h, w["linear.2.weight"], w["linear.2.bias"]), y)

    return script, loss_fn


def batch_norm_case(work, args, body, forward, imports=""):
    """A CNN with batch_norm (`body` in EPL; `forward(x, bn, w)` in PyTorch, bn(h, w, name,
    momentum) its batch_norm), and the running statistics after 10 steps compared too (from
    EPL's last checkpoint). Each micro-batch is normalised with its own statistics, as
    PyTorch with gradient accumulation does; but which samples share one is the sampler's
    order, which this script does not follow: run it with one micro-batch (the -np
    equivalence tests cover micro-batches and ranks)."""
    script, x, y = fashion_case(work, args, body, imports)
    x = x.reshape(-1, 1, 28, 28)
    running = {}  # the buffers, updated in place by every micro-batch's forward

    def bn(h, w, name, momentum):
        if name not in running:
            running[name] = (w[name + ".running_mean"].detach().clone(),
                             w[name + ".running_var"].detach().clone())
        mean, var = running[name]
        return F.batch_norm(h, mean, var, w[name + ".weight"], w[name + ".bias"], training=True,
                            momentum=momentum, eps=1e-5)

    def loss_fn(w):
        total = 0
        for xs, ys in zip(x.chunk(args.micro_batches), y.chunk(args.micro_batches)):
            total = total + F.cross_entropy(forward(xs, bn, w), ys)
        return total / args.micro_batches

    def check_state(ours):
        # Optimizer states for the trainable parameters only, as PyTorch saves them.
        states = [k for k in ours if k.startswith("optimizer/")]
        if not states or any(".running_" in k for k in states):
            sys.exit(f"FAIL: optimizer states in the checkpoint: {states}")
        worst = 0.0
        for name, (mean, var) in running.items():
            for key, theirs in ((".running_mean", mean), (".running_var", var)):
                rel = float((ours[name + key] - theirs).abs().max() / theirs.abs().max())
                worst = max(worst, rel)
                print(f"{name + key}: relative difference {rel:.2e}")
        return worst

    loss_fn.check_state = check_state
    return script, loss_fn


def cnn_bn_case(work, args):
    """batch_norm after a convolution and after the hidden linear (no biases before them)."""
    def forward(xs, bn, w):
        h = F.conv2d(xs, w["conv2d.weight"], padding=1)
        h = F.max_pool2d(F.relu(bn(h, w, "batch_norm", 0.1)), 2)
        h = F.relu(bn(F.linear(h.flatten(1), w["linear.weight"]), w, "batch_norm.1", 0.2))
        return F.linear(h, w["linear.1.weight"], w["linear.1.bias"])

    return batch_norm_case(work, args, """\
  x = max_pool(relu(batch_norm(conv2d(images, 6, 3, padding = 1, bias = false))), 2)
  x = relu(batch_norm(linear(flatten(x), 32, bias = false), momentum = 0.2))
  return cross_entropy(linear(x, 10), labels)""", forward)


def resnet_bn_case(work, args):
    """std/nn.epl's resnet_bn_block (torchvision's BasicBlock) after a convolution and its
    batch_norm."""
    def forward(xs, bn, w):
        h = F.relu(bn(F.conv2d(xs, w["conv2d.weight"], padding=1), w, "batch_norm", 0.1))
        b = "resnet_bn_block/"
        y = F.relu(bn(F.conv2d(h, w[b + "conv2d.weight"], padding=1), w, b + "batch_norm", 0.1))
        y = bn(F.conv2d(y, w[b + "conv2d.1.weight"], padding=1), w, b + "batch_norm.1", 0.1)
        h = F.avg_pool2d(F.relu(h + y), 2)
        return F.linear(h.flatten(1), w["linear.weight"], w["linear.bias"])

    return batch_norm_case(work, args, """\
  x = relu(batch_norm(conv2d(images, 6, 3, padding = 1, bias = false)))
  x = avg_pool(resnet_bn_block(x), 2)
  return cross_entropy(linear(flatten(x), 10), labels)""", forward, 'import "std/nn.epl"')


def text_script(args, name, inputs, body, data, batch):
    """The script of a model `name` of these inputs and body trained 10 steps on `data`
    (corpus.txt), a cosine schedule with 3 warm-up steps."""
    return f"""
import "std/nn.epl"
model {name}({inputs}) {{
{body}
}}
policy {{ micro_batches = {args.micro_batches} }}
train {name} {{
  data = {data}
  batch = {batch}
  optimizer = {OPTIMIZERS[args.optimizer][0]}
  lr_schedule = cosine(warmup = 3)
  steps = 10
  clip_grad_norm = {args.clip}
  checkpoint = {{ dir = "ckpt", every = 100 }}
  seed = 5
}}
"""


def token_case(work, args, name, body):
    """A byte-level model `name` whose `body` (EPL, reading `tokens`) trains 10 steps on the
    start of the fortunes file; returns its script and, for PyTorch, the inputs, the targets
    and the causal mask."""
    seq, batch = 16, 24
    text = open("/usr/share/games/fortunes/cookie", "rb").read()[: seq * batch + 1]
    with open(f"{work}/corpus.txt", "wb") as f:
        f.write(text)
    script = text_script(args, name, f"tokens: i32[B, {seq}]", body,
                         f'text("corpus.txt", seq = {seq}, val_fraction = 0)', batch)
    toks = torch.tensor(list(text), dtype=torch.long)
    inp = torch.stack([toks[i * seq : i * seq + seq] for i in range(batch)])
    tgt = torch.stack([toks[i * seq + 1 : i * seq + seq + 1] for i in range(batch)])
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    return script, inp, tgt, mask


def gpt_case(work, args, tied=False):
    head = ("linear(layer_norm(x), 256, bias = false, tie = embedding)" if tied
            else "linear(layer_norm(x), 256)")
    ignore = "" if args.ignore_index is None else f", ignore_index = {args.ignore_index}"
    script, inp, tgt, mask = token_case(work, args, "gpt", f"""\
  x = embedding(tokens, 256, 32) + positions(16, 32)
  x = repeat(2) transformer_block(x, 4)
  return cross_entropy({head}, next(tokens){ignore})""")

    def loss_fn(w):
        x = F.embedding(inp, w["embedding.weight"]) + w["positions.weight"]
        for i in range(2):
            x = gpt_block(x, w, f"transformer_block.{i}", mask)
        x = F.layer_norm(x, (32,), w["layer_norm.weight"], w["layer_norm.bias"], 1e-5)
        if tied:  # the head reads the embedding's matrix: one tensor, two uses
            assert "linear.weight" not in w, "a tied head has no weight of its own"
            logits = F.linear(x, w["embedding.weight"])
        else:
            logits = F.linear(x, w["linear.weight"], w["linear.bias"])
        if args.ignore_index is None:
            return F.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1))
        return F.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1),
                               ignore_index=args.ignore_index)

    if args.ignore_index is not None:
        kept = [int((part != args.ignore_index).sum()) for part in tgt.chunk(args.micro_batches)]
        print(f"targets kept per micro-batch: {kept}")
        assert len(set(kept)) > 1, "the micro-batches must keep different numbers of targets"
    return script, loss_fn


def document_windows(toks, seq, sep):
    """EPL's `separator` cut: each document (ending with sep) in windows of at most seq + 1
    tokens at its tokens 0, seq, 2 seq..., while two tokens are left."""
    out, first = [], 0
    for i, t in enumerate(toks):
        if t != sep and i + 1 < len(toks):
            continue
        w, stop = first, i + 1
        while stop - w >= 2:
            out.append(toks[w : min(w + seq + 1, stop)])
            w += seq
        first = stop
    return out


def lines_case(work, args):
    """The gpt on the lines of the fortunes (`text(…, separator = 10)`): each line's
    windows padded with 0, the padding masked out of attention (the model's second input)
    and out of the loss (`ignore_index = 0`)."""
    seq = 16
    text = open("/usr/share/games/fortunes/cookie", "rb").read()
    end = 300
    while True:  # whole lines, as many windows as the micro-batches divide
        end = text.index(b"\n", end) + 1
        windows = document_windows(list(text[:end]), seq, 10)
        if len(windows) % (2 * args.micro_batches) == 0:
            break
    with open(f"{work}/corpus.txt", "wb") as f:
        f.write(text[:end])
    batch = len(windows)
    script = text_script(args, "gpt", f"tokens: i32[B, {seq}], mask: i32[B, {seq}]", f"""\
  x = embedding(tokens, 256, 32) + positions({seq}, 32)
  x = repeat(2) transformer_block(x, 4, mask = mask)
  return cross_entropy(linear(layer_norm(x), 256), next(tokens), ignore_index = 0)""",
                         f'text("corpus.txt", seq = {seq}, val_fraction = 0, separator = 10)',
                         batch)
    pad = lambda w: w + [0] * (seq + 1 - len(w))
    inp = torch.tensor([pad(w)[:seq] for w in windows], dtype=torch.long)
    tgt = torch.tensor([pad(w)[1:] for w in windows], dtype=torch.long)
    real = torch.tensor([[t < len(w) for t in range(seq)] for w in windows])
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    mask = causal | ~real[:, None, None, :]  # [B, 1, T, T]: True where a key is masked
    print(f"{batch} windows of {end} bytes, {int((tgt == 0).sum())} of {tgt.numel()} targets "
          f"padding")

    def loss_fn(w):
        x = F.embedding(inp, w["embedding.weight"]) + w["positions.weight"]
        for i in range(2):
            x = gpt_block(x, w, f"transformer_block.{i}", mask)
        x = F.layer_norm(x, (32,), w["layer_norm.weight"], w["layer_norm.bias"], 1e-5)
        logits = F.linear(x, w["linear.weight"], w["linear.bias"])
        return F.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1), ignore_index=0)

    return script, loss_fn


def gpt_block(x, w, p, mask):
    """std/nn.epl's transformer_block(x, 4) of width 32 (`p`: its parameters' prefix)."""
    a = p + "/attention_block/"
    h = F.layer_norm(x, (32,), w[a + "layer_norm.weight"], w[a + "layer_norm.bias"], 1e-5)
    x = x + attention(h, w, a, mask)
    m = p + "/mlp_block/"
    h = F.layer_norm(x, (32,), w[m + "layer_norm.weight"], w[m + "layer_norm.bias"], 1e-5)
    h = F.gelu(F.linear(h, w[m + "mlp.fc1_weight"], w[m + "mlp.fc1_bias"]), approximate="tanh")
    return x + F.linear(h, w[m + "mlp.fc2_weight"], w[m + "mlp.fc2_bias"])


def attention(h, w, prefix, mask):
    """EPL's attention(h, 4) of width 32 (causal, fused qkv; biases where it has them)."""
    qkv = F.linear(h, w[prefix + "attention.qkv_weight"], w.get(prefix + "attention.qkv_bias"))
    q, k, v = qkv.split(32, dim=-1)
    B, T, H = h.shape[0], h.shape[1], 4
    q, k, v = (t.reshape(B, T, H, 8).transpose(1, 2) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(mask, float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, 32)
    return F.linear(o, w[prefix + "attention.proj_weight"], w.get(prefix + "attention.proj_bias"))


def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary(t):
    """RoPE as HF LLaMA applies it (rotate_half) on t [B, heads, T, E], base 10000."""
    T, E = t.shape[-2], t.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, E, 2, dtype=torch.float64) / E))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos()] * 2, -1).to(t.dtype)
    sin = torch.cat([ang.sin()] * 2, -1).to(t.dtype)
    return t * cos + torch.cat([-t[..., E // 2:], t[..., : E // 2]], -1) * sin


def llama_attention(h, w, prefix, mask):
    """EPL's attention(h, 4, bias = false, kv_heads = 2, rotary = true) of width 32: each
    k/v head shared by two query heads."""
    qkv = F.linear(h, w[prefix + "attention.qkv_weight"])
    q, k, v = qkv.split([32, 16, 16], dim=-1)
    B, T = h.shape[0], h.shape[1]
    q = rotary(q.reshape(B, T, 4, 8).transpose(1, 2))
    k = rotary(k.reshape(B, T, 2, 8).transpose(1, 2)).repeat_interleave(2, dim=1)
    v = v.reshape(B, T, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(mask, float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, 32)
    return F.linear(o, w[prefix + "attention.proj_weight"])


def llama_case(work, args):
    """std/nn.epl's llama_block: RMS norms, attention without biases, with rotary
    embeddings and 2 k/v heads for 4, and the gated (SwiGLU) feed-forward."""
    script, inp, tgt, mask = token_case(work, args, "llama", """\
  x = embedding(tokens, 256, 32)
  x = repeat(2) llama_block(x, 4, 48, kv_heads = 2)
  return cross_entropy(linear(rms_norm(x), 256, bias = false), next(tokens))""")

    def block(x, w, p):
        x = x + llama_attention(rms_norm(x, w[p + "rms_norm.weight"]), w, p, mask)
        h = rms_norm(x, w[p + "rms_norm.1.weight"])
        f = p + "swiglu/"
        gated = F.silu(F.linear(h, w[f + "linear.weight"])) * F.linear(h, w[f + "linear.1.weight"])
        return x + F.linear(gated, w[f + "linear.2.weight"])

    def loss_fn(w):
        x = F.embedding(inp, w["embedding.weight"])
        for i in range(2):
            x = block(x, w, f"llama_block.{i}/")
        logits = F.linear(rms_norm(x, w["rms_norm.weight"]), w["linear.weight"])
        return F.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1))

    return script, loss_fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("epl")
    ap.add_argument("work")
    ap.add_argument("case", choices=["mlp", "cnn_bn", "resnet_bn", "gpt", "gpt_tied", "llama",
                                      "lines"])
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    ap.add_argument("--clip", type=float, default=0)
    ap.add_argument("--ignore-index", type=int)
    args = ap.parse_args()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    subprocess.run(["rm", "-rf", f"{work}/ckpt"], check=True)
    cases = {"mlp": mlp_case, "cnn_bn": cnn_bn_case, "resnet_bn": resnet_bn_case,
             "gpt": gpt_case, "llama": llama_case, "lines": lines_case,
             "gpt_tied": lambda work, args: gpt_case(work, args, tied=True)}
    script, loss_fn = cases[args.case](work, args)
    with open(f"{work}/train.epl", "w") as f:
        f.write(script)
    env = dict(os.environ, EPL_STDLIB=os.path.join(os.path.dirname(__file__), "../../stdlib"))
    run = subprocess.run([args.epl, "run", f"{work}/train.epl", "--save-initial", "--metrics",
                          f"{work}/metrics.jsonl"], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"epl run failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    ours = [json.loads(l) for l in open(f"{work}/metrics.jsonl")]
    ours = [r["loss"] for r in ours if "loss" in r]

    w = read_safetensors(f"{work}/ckpt/step-00000000/model.safetensors")
    for t in w.values():
        t.requires_grad_(True)
    params = list(w.values())
    opt = OPTIMIZERS[args.optimizer][1](params)
    sched = None
    if args.case not in ("mlp", "cnn_bn", "resnet_bn"):  # those keep a constant rate
        lr0 = opt.param_groups[0]["lr"]
        def lr_at(s):  # EPL's cosine(warmup = 3) over 10 steps, min_lr 0
            if s < 3:
                return lr0 * (s + 1) / 3
            t = min(1.0, (s - 3) / max(10 - 1 - 3, 1))
            return 0.5 * lr0 * (1 + math.cos(math.pi * t))
        sched = lr_at
    theirs = []
    for s in range(10):
        if sched:
            for g in opt.param_groups:
                g["lr"] = sched(s)
        opt.zero_grad()
        loss = loss_fn(w)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        theirs.append(loss.item())
    worst = 0.0
    for s, (a, b) in enumerate(zip(ours, theirs)):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        print(f"step {s + 1:2}: epl {a:.7f}  torch {b:.7f}  rel {rel:.2e}")
    if len(ours) != 10:
        sys.exit(f"expected 10 steps from epl, got {len(ours)}")
    if hasattr(loss_fn, "check_state"):  # state the forward keeps, after the last step
        state = loss_fn.check_state(read_safetensors(f"{work}/ckpt/step-00000010/model.safetensors"))
        worst = max(worst, state)
    print(f"worst relative difference {worst:.2e} (tolerance {TOLERANCE:g})")
    if worst > TOLERANCE:
        sys.exit("FAIL: EPL and PyTorch disagree")


if __name__ == "__main__":
    main()
