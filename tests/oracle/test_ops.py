#!/usr/bin/python3
"""Oracle tests of the kernels against PyTorch, and of the CUDA kernels against the CPU's.

Usage: test_ops.py PATH/TO/epl_kernel_probe FAMILY [--device cuda]

For each case, random fp32 inputs and parameters go through the kernel probe (forward and
backward through makeCpuDevice()->launch) and through the same computation written plainly
in torch, in float64, with autograd for the gradients. The reference is float64 so the
error measured is the kernel's own, not the sum of two fp32 errors.

Error of a result a against its reference b:  max|a - b| / max(max|b|, 1e-6)
(relative to the largest reference value, with an absolute floor for all-zero
references; equal values, infinities included, differ by 0, and infinite references do not
count in the largest). Every output, every saved tensor the backward reads, and the gradient of
every float input and every parameter must be within TOL.

With --device cuda every case runs on the GPU, checked against the same reference, and once
more on the CPU: each result file of the GPU must match the CPU's (the CPU device is the
oracle of the others) within CROSS_TOL, and integer results exactly. Without a GPU the
family is skipped (exit 77).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

SKIP = 77  # CTest's SKIP_RETURN_CODE for the gpu tests


def skip_without_device():
    """Exits with SKIP when the probe cannot make the device that --device names: asked before
    torch is imported, which alone takes seconds."""
    args = sys.argv[1:]
    if len(args) != 4 or args[2] != "--device" or args[3] == "cpu":
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json") as case:
        json.dump({"device": args[3], "mode": "device"}, case)
        case.flush()
        r = subprocess.run([args[0], case.name], capture_output=True, text=True)
    if r.returncode == SKIP:
        print("skipped: %s" % r.stderr.strip())
        sys.exit(SKIP)


if __name__ == "__main__":
    skip_without_device()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOL = 1e-5
FLOOR = 1e-6
CROSS_TOL = 2e-5  # GPU against CPU: two fp32 results, each within TOL of the reference
# Cases run with TF32 products ("matmul": "tf32", policy `matmul`) on a GPU: each product's
# operands rounded to 10 bits of mantissa (2^-11 relative), against the reference and the
# CPU's f32 results alike.
TF32_TOL = 5e-3

torch.set_num_threads(1)


def rel_err(ours, ref):
    ours = torch.as_tensor(ours, dtype=torch.float64)
    ref = ref.detach().to(torch.float64)
    if ours.numel() == 0:
        return 0.0
    diff = torch.where(ours == ref, torch.zeros_like(ref), (ours - ref).abs())
    finite = ref[torch.isfinite(ref)]
    largest = float(finite.abs().max()) if finite.numel() else 0.0
    return float(diff.max() / max(largest, FLOOR))


class Probe:
    """Writes a case, runs the probe on it, reads the results back."""

    def __init__(self, exe, tmp, device="cpu", rep=None):
        self.exe, self.tmp, self.count = exe, tmp, 0
        self.device, self.rep = device, rep

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _write(self, t, name):
        arr = t.detach().numpy()
        arr = arr.astype("<i4" if arr.dtype.kind == "i" else "<f4")
        arr.tofile(self._path(name))
        return self._path(name)

    def _read(self, name, shape, dtype="<f4"):
        return torch.from_numpy(np.fromfile(self._path(name), dtype=dtype).reshape(shape).copy())

    def new_dir(self):
        self.count += 1
        self.dir = os.path.join(self.tmp, "case%d" % self.count)
        os.makedirs(self.dir)

    def _run(self, case, out_dir, device):
        case = dict(case, out_dir=out_dir, device=device)
        path = os.path.join(out_dir, "case.json")
        with open(path, "w") as f:
            json.dump(case, f)
        r = subprocess.run([self.exe, path], capture_output=True, text=True)
        if r.returncode == SKIP:
            raise NoDevice(r.stderr.strip())
        if r.returncode != 0:
            raise RuntimeError("probe failed on %s (%d): %s" % (device, r.returncode,
                                                                r.stderr.strip()))

    def run_json(self, case):
        self._run(case, self.dir, self.device)
        if self.device != "cpu":
            cpu_dir = os.path.join(self.dir, "cpu")
            os.makedirs(cpu_dir)
            self._run(case, cpu_dir, "cpu")
            self._cross_check(case, cpu_dir)

    def _cross_check(self, case, cpu_dir):
        """Every result file of the device against the CPU's."""
        label = "%s#%d" % (case.get("op", case.get("mode")), self.count)
        tol = TF32_TOL if case.get("matmul") == "tf32" else CROSS_TOL
        for name in sorted(os.listdir(cpu_dir)):
            if not name.endswith(".bin"):
                continue
            ours = np.fromfile(self._path(name), dtype="<f4")
            ref = np.fromfile(os.path.join(cpu_dir, name), dtype="<f4")
            if ours.size != ref.size:
                self.rep.expect(label, "cpu " + name, False, "sizes differ")
                continue
            exact = np.array_equal(ours.view("<u4"), ref.view("<u4"))
            # An i32 file (argmax indices, small and not negative) read as f32 is all zeros
            # and subnormals: it must be exact. A float file may hold a few subnormals
            # (a softmax or a GELU gradient of large inputs) and is compared as floats.
            nonzero = ref[ref != 0]
            integers = nonzero.size > 0 and bool(
                (np.abs(nonzero) < np.finfo(np.float32).tiny).all())
            if exact:
                self.rep.cross(label, name, 0.0)
            elif integers:
                self.rep.expect(label, "cpu " + name, False, "integers differ")
            else:
                self.rep.cross(label, name, rel_err(torch.from_numpy(ours.copy()),
                                                    torch.from_numpy(ref.copy())), tol)

    def op(self, op, attrs, inputs, params, out_shape, saved=(), dy=None, accumulate=None,
           acc_init=None, want=None, training=True, seed=0, backward=True, repeat=2, extra=None):
        """Runs op; returns (out, [saved], [grads of inputs then params]).
        saved: (shape, dtype) of each saved tensor. extra: more keys of the case
        ("sample_weight", "param_pieces"). The other outputs of an op with several: out()."""
        self.new_dir()
        case = dict(extra or {})
        case.update({"op": op, "attrs": attrs, "training": training, "seed": seed,
                     "backward": backward, "repeat": repeat,
                     "inputs": [{"dtype": "i32" if t.dtype == torch.int32 else "f32",
                                 "shape": list(t.shape), "path": self._write(t, "in%d.bin" % i)}
                                for i, t in enumerate(inputs)],
                     "params": [{"shape": list(t.shape), "path": self._write(t, "p%d.bin" % i)}
                                for i, t in enumerate(params)]})
        if dy is not None:
            case["dy"] = self._write(dy, "dy.bin")
        if accumulate is not None:
            case["accumulate"] = accumulate
            case["acc_init"] = [self._write(t, "acc%d.bin" % i) if t is not None else ""
                                for i, t in enumerate(acc_init)]
        if want is not None:
            case["want"] = want
        self.run_json(case)
        out = self._read("out.bin", out_shape)
        sv = [self._read("saved%d.bin" % i, s, "<i4" if d == "i32" else "<f4")
              for i, (s, d) in enumerate(saved)]
        grads = []
        if backward:
            for i, t in enumerate(list(inputs) + list(params)):
                grads.append(self._read("grad%d.bin" % i, tuple(t.shape)))
        return out, sv, grads

    def out(self, i, shape, dtype="f32"):
        """Output i (> 0) of the last case run."""
        return self._read("out%d.bin" % i, shape, "<i4" if dtype == "i32" else "<f4")


class NoDevice(Exception):
    """The probe has no such device here (no GPU, or a build without CUDA)."""


class Report:
    def __init__(self):
        self.worst, self.failures = {}, []
        self.cross_worst = 0.0

    def cross(self, case, what, e, tol=CROSS_TOL):
        ok = e <= tol
        self.cross_worst = max(self.cross_worst, e) if ok else float("inf")
        if not ok:
            print("  %-48s %-14s err %.2e  FAIL (device vs cpu)" % (case, what, e))
            self.failures.append("%s %s: device vs cpu %.3e > %.1e" % (case, what, e, tol))

    def check(self, case, what, ours, ref, tol=TOL):
        e = rel_err(ours, ref)
        op = case.split("[")[0]
        ok = e <= tol  # False for NaN too
        self.worst[op] = e if not ok else max(self.worst.get(op, 0.0), e)
        print("  %-48s %-14s err %.2e  %s" % (case, what, e, "ok" if ok else "FAIL"))
        if not ok:
            self.failures.append("%s %s: %.3e > %.1e" % (case, what, e, tol))

    def expect(self, case, what, cond, detail=""):
        print("  %-48s %-14s %s %s" % (case, what, "ok" if cond else "FAIL", detail))
        if not cond:
            self.failures.append("%s %s %s" % (case, what, detail))


def rand(*shape, scale=1.0):
    return torch.randn(size=tuple(shape), dtype=torch.float32) * scale


def run_case(probe, rep, name, op, attrs, inputs, params, ref_fn, saved_ref=None,
             accumulate=False, want=None, training=True, seed=0, extra=None, tol=TOL):
    """ref_fn(inputs64, params64) -> output (float64, differentiable). saved_ref(inputs64,
    params64) -> list of (tensor, dtype str) the forward saves, checked too. extra: more keys
    of the case (Probe.op). tol: every result's against the reference."""
    ins64 = [t.double().requires_grad_() if t.is_floating_point() else t.long() for t in inputs]
    ps64 = [t.double().requires_grad_() for t in params]
    out = ref_fn(ins64, ps64)
    dy = rand(*out.shape)
    out.backward(dy.double())
    ref_grads = [t.grad if t.is_floating_point() and t.grad is not None else
                 (torch.zeros(t.shape, dtype=torch.float64) if t.is_floating_point() else None)
                 for t in ins64 + ps64]
    saved = [] if saved_ref is None else saved_ref(
        [t.detach() for t in ins64], [t.detach() for t in ps64])
    acc_flags, acc_init = None, None
    if accumulate:
        acc_flags = [t.is_floating_point() for t in inputs + params]
        acc_init = [rand(*t.shape) if f else None for t, f in zip(inputs + params, acc_flags)]
    try:
        o, sv, grads = probe.op(op, attrs, inputs, params, tuple(out.shape),
                                [(tuple(s.shape), d) for s, d in saved], dy, acc_flags, acc_init,
                                want, training, seed, extra=extra)
    except RuntimeError as e:  # a crash: name the case
        raise RuntimeError("%s: %s" % (name, e)) from e
    rep.check(name, "out", o, out, tol)
    for i, ((s, d), ours) in enumerate(zip(saved, sv)):
        if d == "i32":
            rep.expect(name, "saved%d" % i, torch.equal(ours.long(), s.long()))
        else:
            rep.check(name, "saved%d" % i, ours, s, tol)
    labels = ["d_in%d" % i for i in range(len(inputs))] + ["d_p%d" % i for i in range(len(params))]
    for i, (g, ref) in enumerate(zip(grads, ref_grads)):
        if ref is None or (want is not None and not want[i]):
            continue
        if accumulate:
            ref = ref + acc_init[i].double()
        rep.check(name, labels[i], g, ref, tol)


def split_cases(probe, rep, name, op, attrs, inputs, params, ref_fn, extra=None, tol=TOL):
    """zb's split backward runs a kernel twice: B with only the input gradients wanted, W with
    only the parameter gradients; each must still be right when the other outputs are null
    (intermediate gradients a parameter needs are computed anyway), writing and adding."""
    n, k = len(inputs), len(params)
    for part, want in [("params only", [False] * n + [True] * k),
                       ("inputs only", [True] * n + [False] * k)]:
        for acc in (False, True):
            run_case(probe, rep, "%s[%s%s]" % (name, part, ", accumulate" if acc else ""), op,
                     attrs, inputs, params, ref_fn, accumulate=acc, want=want, extra=extra,
                     tol=tol)


# ---------------------------------------------------------------------------------------
# Families


def fam_linear(probe, rep):
    for shape, out, bias in [((4, 7), 5, True), ((3, 5, 16), 33, True), ((2, 9, 64), 48, False),
                             ((1, 1), 1, True), ((17, 128), 256, True),
                             ((4, 512, 16), 32, True)]:  # dW: K = 2048 rows, cut into pieces
        d = shape[-1]
        x, w = rand(*shape), rand(out, d, scale=d ** -0.5)
        params = [w] + ([rand(out)] if bias else [])
        ref = (lambda i, p: F.linear(i[0], p[0], p[1] if len(p) > 1 else None))
        run_case(probe, rep, "linear[%s,out=%d,bias=%s]" % (shape, out, bias), "linear",
                 {"out": out, "bias": bias}, [x], params, ref)
    x, w, b = rand(6, 10), rand(4, 10), rand(4)
    ref = lambda i, p: F.linear(i[0], p[0], p[1])
    run_case(probe, rep, "linear[accumulate]", "linear", {"out": 4}, [x], [w, b], ref,
             accumulate=True)
    run_case(probe, rep, "linear[no dx]", "linear", {"out": 4}, [x], [w, b], ref,
             want=[False, True, True])
    split_cases(probe, rep, "linear", "linear", {"out": 4}, [x], [w, b], ref)
    split_cases(probe, rep, "linear", "linear", {"out": 4, "bias": False}, [x], [w],
                lambda i, p: F.linear(i[0], p[0]))


def fam_embedding(probe, rep):
    for shape, vocab, dim in [((4,), 10, 3), ((2, 9), 17, 8), ((3, 64), 256, 32)]:
        tok = torch.randint(0, vocab, shape, dtype=torch.int32)
        tok.view(-1)[0] = tok.view(-1)[-1]  # repeated ids accumulate in the gradient
        w = rand(vocab, dim)
        run_case(probe, rep, "embedding[%s,V=%d,D=%d]" % (shape, vocab, dim), "embedding",
                 {"vocab": vocab, "dim": dim}, [tok], [w], lambda i, p: F.embedding(i[0], p[0]))
    tok = torch.randint(0, 5, (3, 4), dtype=torch.int32)
    run_case(probe, rep, "embedding[accumulate]", "embedding", {"vocab": 5, "dim": 6}, [tok],
             [rand(5, 6)], lambda i, p: F.embedding(i[0], p[0]), accumulate=True)
    for seq, dim in [(5, 3), (128, 64)]:
        run_case(probe, rep, "positions[T=%d,D=%d]" % (seq, dim), "positions",
                 {"seq": seq, "dim": dim}, [], [rand(seq, dim)], lambda i, p: p[0] * 1.0)
    run_case(probe, rep, "positions[accumulate]", "positions", {"seq": 4, "dim": 2}, [],
             [rand(4, 2)], lambda i, p: p[0] * 1.0, accumulate=True)
    split_cases(probe, rep, "embedding", "embedding", {"vocab": 5, "dim": 6}, [tok], [rand(5, 6)],
                lambda i, p: F.embedding(i[0], p[0]))
    # A vocabulary split's slice of the table: rows [first, first + rows) of the whole vocab;
    # the other tokens look up zeros and give no gradient (another device holds them).
    for shape, vocab, dim, first, rows in [((3, 10), 20, 6, 8, 7), ((3, 64), 256, 32, 128, 128),
                                           ((2, 9), 17, 8, 0, 9)]:
        tok = torch.randint(0, vocab, shape, dtype=torch.int32)
        tok.view(-1)[:3] = torch.tensor([first, first + rows - 1, first])  # held, repeated

        def sliced(i, p, first=first, rows=rows):
            r = i[0] - first
            held = (r >= 0) & (r < rows)
            return F.embedding(r.clamp(0, rows - 1), p[0]) * held.unsqueeze(-1)
        name = "embedding[vocab slice %d+%d of %d,%s]" % (first, rows, vocab, shape)
        extra = {"param_pieces": True, "vocab_first": first}
        attrs = {"vocab": vocab, "dim": dim}
        run_case(probe, rep, name, "embedding", attrs, [tok], [rand(rows, dim)], sliced,
                 extra=extra)
        run_case(probe, rep, name + "[accumulate]", "embedding", attrs, [tok], [rand(rows, dim)],
                 sliced, accumulate=True, extra=extra)
    split_cases(probe, rep, "positions", "positions", {"seq": 4, "dim": 2}, [], [rand(4, 2)],
                lambda i, p: p[0] * 1.0)


def layer_norm_saved(i, p, eps):
    x = i[0]
    mean = x.mean(-1)
    var = x.var(-1, unbiased=False)
    return [(mean, "f32"), ((var + eps).rsqrt(), "f32")]


def rms_ref(x, w, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


def fam_norms(probe, rep):
    # No D = 1 or 2: the exact dx of layer_norm is then zero or O(eps), a cancellation fp32
    # cannot resolve (torch in fp32 cannot either).
    for shape in [(4, 7), (2, 5, 32), (3, 9, 256), (1, 3), (5, 3)]:
        d = shape[-1]
        x = rand(*shape) * 3 + 1
        w, b = 1 + 0.1 * rand(d), 0.1 * rand(d)
        eps = 1e-5
        run_case(probe, rep, "layer_norm[%s]" % (shape,), "layer_norm", {"eps": eps}, [x], [w, b],
                 lambda i, p: F.layer_norm(i[0], (d,), p[0], p[1], eps),
                 lambda i, p: layer_norm_saved(i, p, eps))
        run_case(probe, rep, "rms_norm[%s]" % (shape,), "rms_norm", {"eps": 1e-6}, [x], [w],
                 lambda i, p: rms_ref(i[0], p[0], 1e-6),
                 lambda i, p: [((i[0].pow(2).mean(-1) + 1e-6).rsqrt(), "f32")])
    x, w, b = rand(3, 8), rand(8), rand(8)
    run_case(probe, rep, "layer_norm[accumulate]", "layer_norm", {}, [x], [w, b],
             lambda i, p: F.layer_norm(i[0], (8,), p[0], p[1], 1e-5), accumulate=True)
    run_case(probe, rep, "rms_norm[accumulate]", "rms_norm", {}, [x], [w],
             lambda i, p: rms_ref(i[0], p[0], 1e-6), accumulate=True)
    batch_norm_cases(probe, rep)
    x = rand(70, 8)  # three row blocks of partial sums
    split_cases(probe, rep, "layer_norm", "layer_norm", {}, [x], [w, b],
                lambda i, p: F.layer_norm(i[0], (8,), p[0], p[1], 1e-5))
    split_cases(probe, rep, "rms_norm", "rms_norm", {}, [x], [w],
                lambda i, p: rms_ref(i[0], p[0], 1e-6))


def batch_norm_cases(probe, rep):
    """batch_norm: each channel (dim 1) over the batch and the other dims. Training reads the
    batch's statistics (saved: the mean and 1 / sqrt(biased variance + eps)) and passes no
    gradient to the running ones; evaluation reads the running ones."""
    def saved(i, p, eps):
        dims = [0] + list(range(2, i[0].dim()))
        return [(i[0].mean(dims), "f32"),
                ((i[0].var(dims, unbiased=False) + eps).rsqrt(), "f32")]
    def ref(eps, momentum):
        return lambda i, p: F.batch_norm(i[0], p[2].detach().clone(), p[3].detach().clone(),
                                         p[0], p[1], training=True, momentum=momentum, eps=eps)
    for shape, eps in [((16, 6), 1e-5), ((4, 3, 5, 5), 1e-5), ((2, 8, 3, 7, 2), 1e-3),
                       ((64, 2, 9, 9), 1e-5)]:
        c = shape[1]
        x = rand(*shape) * 2 + 0.5
        params = [1 + 0.1 * rand(c), 0.1 * rand(c), 0.1 * rand(c), 1 + 0.1 * rand(c).abs()]
        run_case(probe, rep, "batch_norm[%s]" % (shape,), "batch_norm",
                 {"eps": eps, "momentum": 0.2}, [x], params, ref(eps, 0.2),
                 lambda i, p, eps=eps: saved(i, p, eps))
    x = rand(5, 4, 3)
    params = [rand(4), rand(4), rand(4), 1 + rand(4).abs()]
    run_case(probe, rep, "batch_norm[accumulate]", "batch_norm", {}, [x], params,
             ref(1e-5, 0.1), accumulate=True)
    o, _, _ = probe.op("batch_norm", {}, [x], params, tuple(x.shape), training=False,
                       backward=False)
    p64 = [t.double() for t in params]
    rep.check("batch_norm[eval]", "out",
              o, F.batch_norm(x.double(), p64[2], p64[3], p64[0], p64[1], training=False))


def rotary_ref(t, base):
    """RoPE in HF LLaMA's "rotate half" form on t [B, heads, T, E]: dims i and i + E/2 of
    position p turn by the angle p base^(-2i/E)."""
    T, E = t.shape[-2], t.shape[-1]
    inv = base ** (-torch.arange(0, E, 2, dtype=torch.float64) / E)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    half = torch.cat([-t[..., E // 2:], t[..., : E // 2]], -1)
    return t * cos + half * sin


def attention_parts(x, wqkv, bqkv, wp, bp, heads, causal, kv_heads=None, rotary=False,
                    base=10000.0, mask=None):
    """EPL's attention in plain torch: q, k, v rows of the fused projection (k and v
    kv_heads wide, each shared by heads / kv_heads query heads: repeat_interleave), rotary
    on q and k, and a padding mask [B, T] (non-zero keeps a key; PyTorch's key_padding_mask
    is its inverse, mask == 0). A row whose every key is masked gets probabilities 0 (not
    softmax's NaN) and lse -inf. Returns (y, saved qkv (q and k turned), ctx, lse). The heads
    may be a split device's share, narrower together than x (wqkv's rows give the head width)."""
    B, T, D = x.shape
    kv = kv_heads or heads
    hd = wqkv.shape[0] // (heads + 2 * kv)
    qkv = x @ wqkv.t() + (0 if bqkv is None else bqkv)
    q, k, v = qkv.split([heads * hd, kv * hd, kv * hd], dim=-1)
    split = lambda t, n: t.reshape(B, T, n, hd).transpose(1, 2)
    join = lambda t: t.transpose(1, 2).reshape(B, T, -1)
    q, k, v = split(q, heads), split(k, kv), split(v, kv)
    if rotary:
        q, k = rotary_ref(q, base), rotary_ref(k, base)
    saved = torch.cat([join(q), join(k), join(v)], -1)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    if mask is not None:
        allowed = allowed & (mask != 0)[:, None, None, :]
    s = s.masked_fill(~allowed, float("-inf"))
    some = allowed.any(-1, keepdim=True)  # rows with a key to attend to
    p = torch.softmax(torch.where(some, s, torch.zeros_like(s)), -1) * some
    ctx = join(p @ v)
    y = ctx @ wp.t() + (0 if bp is None else bp)
    return y, saved, ctx, torch.logsumexp(s, -1)


def attention_weights(D, H, KV, bias):
    """attention's parameters for width D, H query and KV key/value heads: the fused qkv
    weight [D + 2 KV D/H, D] (q rows, then k, then v) and the output projection, each with
    its bias when `bias`."""
    rows = D + 2 * KV * (D // H)
    w = [rand(rows, D, scale=D ** -0.5), 0.1 * rand(rows), rand(D, D, scale=D ** -0.5),
         0.1 * rand(D)]
    return w if bias else [w[0], w[2]]


def attention_gqa_rotary(probe, rep):
    """kv_heads below heads (grouped-query; 1: multi-query) and rotary embeddings, with
    and without causal masks and biases: the output, the saved tensors and every gradient."""
    cases = [(2, 7, 16, 4, 2, True, True, False, 10000.0),
             (1, 70, 32, 4, 1, False, True, False, 10000.0),
             (2, 65, 32, 4, 4, True, False, True, 10000.0),
             (2, 100, 32, 4, 2, True, False, True, 10000.0),
             (1, 130, 48, 6, 3, False, True, True, 10000.0),
             (2, 9, 32, 8, 2, False, False, True, 10000.0),
             (1, 33, 16, 2, 1, True, True, True, 500000.0),
             (1, 1, 8, 2, 1, True, False, True, 10000.0)]
    for B, T, D, H, KV, causal, bias, rotary, base in cases:
        params = attention_weights(D, H, KV, bias)
        attrs = {"heads": H, "kv_heads": KV, "causal": causal, "bias": bias, "rotary": rotary,
                 "rotary_base": base}

        def parts(i, p, H=H, KV=KV, causal=causal, bias=bias, rotary=rotary, base=base):
            full = p if bias else [p[0], None, p[1], None]
            return attention_parts(i[0], *full, H, causal, KV, rotary, base)

        name = "attention[B=%d,T=%d,D=%d,H=%d,KV=%d,causal=%s,bias=%s,rotary=%s%s]" % (
            B, T, D, H, KV, causal, bias, rotary, ",base=%g" % base if base != 10000 else "")
        run_case(probe, rep, name, "attention", attrs, [rand(B, T, D)], params,
                 lambda i, p, parts=parts: parts(i, p)[0],
                 lambda i, p, parts=parts: [(t, "f32") for t in parts(i, p)[1:]])
    # Several query heads add into one k/v head's gradient: onto what is there, and zb's
    # split backward (parameters only, inputs only).
    B, T, D, H, KV = 2, 70, 32, 4, 2
    weights = attention_weights(D, H, KV, False)
    attrs = {"heads": H, "kv_heads": KV, "bias": False, "rotary": True}
    ref = lambda i, p: attention_parts(i[0], p[0], None, p[1], None, H, True, KV, True)[0]
    run_case(probe, rep, "attention[kv_heads, rotary, accumulate]", "attention", attrs,
             [rand(B, T, D)], weights, ref, accumulate=True)
    split_cases(probe, rep, "attention[kv_heads, rotary]", "attention", attrs, [rand(B, T, D)],
                weights, ref)


def attention_masks(probe, rep):
    """Padding masks [B, T] of mixed lengths (and not only prefixes; any non-zero keeps a
    key), with and without causal, kv_heads and rotary, a sample whose every key is masked
    and causal rows before a left padding's first key: the output, the saved tensors and
    every gradient."""
    def lengths(T, *n):
        return torch.stack([(torch.arange(T) < k).to(torch.int32) for k in n])

    scattered = torch.randint(0, 2, (2, 130), dtype=torch.int32) * torch.randint(1, 6, (2, 130),
                                                                                dtype=torch.int32)
    left = torch.stack([(torch.arange(10) >= 3).to(torch.int32), torch.ones(10, dtype=torch.int32)])
    cases = [  # B, T, D, H, KV, causal, bias, rotary, mask
        (3, 7, 16, 4, 4, False, True, False, lengths(7, 7, 4, 1)),
        (2, 70, 32, 4, 2, True, True, True, lengths(70, 70, 33)),
        (2, 70, 32, 4, 2, False, False, True, lengths(70, 5, 66)),
        (2, 130, 24, 3, 3, False, True, False, scattered),
        (2, 9, 16, 2, 1, False, True, True, lengths(9, 9, 0)),  # sample 1: no key at all
        (2, 10, 16, 2, 2, True, False, False, left),  # causal rows 0-2 of sample 0: no key
    ]
    for B, T, D, H, KV, causal, bias, rotary, mask in cases:
        params = attention_weights(D, H, KV, bias)
        attrs = {"heads": H, "kv_heads": KV, "causal": causal, "bias": bias, "rotary": rotary,
                 "mask": True}

        def parts(i, p, H=H, KV=KV, causal=causal, bias=bias, rotary=rotary):
            full = p if bias else [p[0], None, p[1], None]
            return attention_parts(i[0], *full, H, causal, KV, rotary, mask=i[1])

        name = "attention[mask,B=%d,T=%d,D=%d,H=%d,KV=%d,causal=%s,bias=%s,rotary=%s]" % (
            B, T, D, H, KV, causal, bias, rotary)
        run_case(probe, rep, name, "attention", attrs, [rand(B, T, D), mask], params,
                 lambda i, p, parts=parts: parts(i, p)[0],
                 lambda i, p, parts=parts: [(t, "f32") for t in parts(i, p)[1:]])
    B, T, D, H = 2, 70, 16, 2
    params = [rand(3 * D, D, scale=D ** -0.5), rand(3 * D), rand(D, D, scale=D ** -0.5), rand(D)]
    mask = lengths(T, 40, 0)
    attrs = {"heads": H, "causal": False, "mask": True}
    ref = lambda i, p: attention_parts(i[0], *p, H, False, mask=i[1])[0]
    run_case(probe, rep, "attention[mask, accumulate]", "attention", attrs,
             [rand(B, T, D), mask], params, ref, accumulate=True)
    split_cases(probe, rep, "attention[mask]", "attention", attrs, [rand(B, T, D), mask], params,
                ref)


def fam_attention(probe, rep):
    cases = [(1, 5, 8, 2, True), (2, 7, 12, 3, False), (2, 64, 32, 4, True),
             (1, 100, 16, 2, True), (2, 130, 24, 3, False), (1, 130, 24, 1, True),
             (3, 128, 64, 8, True), (1, 1, 4, 1, True), (1, 200, 32, 2, False),
             # From T = 256 the CUDA kernel takes causal queries in two chunks (128 and 129).
             (1, 257, 16, 2, True), (2, 300, 24, 3, True)]
    for B, T, D, H, causal in cases:
        x = rand(B, T, D)
        params = [rand(3 * D, D, scale=D ** -0.5), 0.1 * rand(3 * D), rand(D, D, scale=D ** -0.5),
                  0.1 * rand(D)]
        name = "attention[B=%d,T=%d,D=%d,H=%d,causal=%s]" % (B, T, D, H, causal)
        run_case(probe, rep, name, "attention", {"heads": H, "causal": causal}, [x], params,
                 lambda i, p: attention_parts(i[0], *p, H, causal)[0],
                 lambda i, p: [(t, "f32") for t in attention_parts(i[0], *p, H, causal)[1:]])
    B, T, D, H = 2, 70, 16, 2
    params = [rand(3 * D, D, scale=D ** -0.5), rand(3 * D), rand(D, D, scale=D ** -0.5), rand(D)]
    run_case(probe, rep, "attention[accumulate]", "attention", {"heads": H}, [rand(B, T, D)],
             params, lambda i, p: attention_parts(i[0], *p, H, True)[0], accumulate=True)
    split_cases(probe, rep, "attention", "attention", {"heads": H}, [rand(B, T, D)], params,
                lambda i, p: attention_parts(i[0], *p, H, True)[0])
    # Without biases (LLaMA's): the parameters are Wqkv and Wp alone.
    weights = [params[0], params[2]]
    no_bias = lambda i, p: attention_parts(i[0], p[0], None, p[1], None, H, True)
    run_case(probe, rep, "attention[bias=false]", "attention", {"heads": H, "bias": False},
             [rand(B, T, D)], weights, lambda i, p: no_bias(i, p)[0],
             lambda i, p: [(t, "f32") for t in no_bias(i, p)[1:]])
    run_case(probe, rep, "attention[bias=false, accumulate]", "attention",
             {"heads": H, "bias": False}, [rand(B, T, D)], weights,
             lambda i, p: no_bias(i, p)[0], accumulate=True)
    split_cases(probe, rep, "attention[bias=false]", "attention", {"heads": H, "bias": False},
                [rand(B, T, D)], weights, lambda i, p: no_bias(i, p)[0])
    attention_split_heads(probe, rep)
    attention_gqa_rotary(probe, rep)
    attention_masks(probe, rep)
    attention_tf32(probe, rep)


def attention_tf32(probe, rep):
    """A GPU runs attention's dot products tiled, their scores in shared memory
    (backend/cuda/FlashTiles.cuh), for heads up to 128 wide; these cases with TF32 products
    (`matmul = tf32`), the family's others with the default's fp32 ones: each padded width
    (32, 64, 128), sequences over several tiles and ending inside one, causal and padding
    masks (a sample with no key), k/v heads shared, rotary, no biases, added gradients, zb's
    split backward and a split device's share of the heads; and a head 160 wide, which keeps
    cuBLAS's products over scores. The CPU multiplies in f32 whatever the case says: only a
    GPU runs these."""
    if probe.device == "cpu":
        return
    def lengths(T, *n):
        return torch.stack([(torch.arange(T) < k).to(torch.int32) for k in n])

    tf32 = {"matmul": "tf32"}
    cases = [  # B, T, D, H, KV, causal, bias, rotary, mask
        (2, 70, 64, 4, 4, True, True, False, None),  # E 16
        (1, 130, 128, 2, 1, False, True, False, lengths(130, 97)),  # E 64, one k/v head
        (2, 200, 96, 4, 2, True, False, True, lengths(200, 200, 0)),  # E 24, sample 1 no key
        (1, 65, 256, 2, 2, True, True, False, None),  # E 128
        (1, 40, 200, 2, 2, False, True, False, None),  # E 100, padded to 128
        (1, 300, 64, 2, 2, True, True, False, None),  # E 32 over five tiles
        (1, 33, 320, 2, 2, True, True, False, None),  # E 160: cuBLAS's products over scores
    ]
    for B, T, D, H, KV, causal, bias, rotary, mask in cases:
        params = attention_weights(D, H, KV, bias)
        attrs = {"heads": H, "kv_heads": KV, "causal": causal, "bias": bias, "rotary": rotary,
                 "mask": mask is not None}
        inputs = [rand(B, T, D)] + ([] if mask is None else [mask])

        def parts(i, p, H=H, KV=KV, causal=causal, bias=bias, rotary=rotary, masked=mask is not None):
            full = p if bias else [p[0], None, p[1], None]
            return attention_parts(i[0], *full, H, causal, KV, rotary,
                                   mask=i[1] if masked else None)

        name = "attention[tf32,B=%d,T=%d,D=%d,H=%d,KV=%d,causal=%s,bias=%s,rotary=%s,mask=%s]" % (
            B, T, D, H, KV, causal, bias, rotary, mask is not None)
        run_case(probe, rep, name, "attention", attrs, inputs, params,
                 lambda i, p, parts=parts: parts(i, p)[0],
                 lambda i, p, parts=parts: [(t, "f32") for t in parts(i, p)[1:]],
                 extra=tf32, tol=TF32_TOL)
    B, T, D, H = 2, 100, 64, 2
    params = attention_weights(D, H, H, True)
    ref = lambda i, p: attention_parts(i[0], *p, H, True)[0]
    run_case(probe, rep, "attention[tf32, accumulate]", "attention", {"heads": H},
             [rand(B, T, D)], params, ref, accumulate=True, extra=tf32, tol=TF32_TOL)
    split_cases(probe, rep, "attention[tf32]", "attention", {"heads": H}, [rand(B, T, D)],
                params, ref, extra=tf32, tol=TF32_TOL)
    attention_split_heads(probe, rep, tf32=True)


def attention_split_heads(probe, rep, tf32=False):
    """A device's share of a split attention's heads (SplitLayout's Heads form): x and y are
    the model's width D, Wqkv's rows and Wp's columns the share's, and y a partial sum. With
    tf32, the cases with TF32 products (attention_tf32)."""
    tol = TF32_TOL if tf32 else TOL
    for B, T, D, H, E, causal, bias in [(2, 40, 24, 2, 6, True, True), (1, 33, 16, 1, 8, False, False),
                                        (1, 260, 32, 2, 8, True, True)]:
        params = [rand(3 * H * E, D, scale=D ** -0.5), 0.1 * rand(3 * H * E),
                  rand(D, H * E, scale=(H * E) ** -0.5), 0.1 * rand(D)]
        if not bias:
            params = [params[0], params[2]]
        full = lambda p: (p if len(p) == 4 else [p[0], None, p[1], None])
        parts = lambda i, p: attention_parts(i[0], *full(p), H, causal)
        attrs = {"heads": H, "causal": causal, "bias": bias}
        extra = {"param_pieces": True,
                 "saved_shapes": [[B, T, 3 * H * E], [B, T, H * E], [B, H, T]]}
        if tf32:
            extra["matmul"] = "tf32"
        name = "attention[%ssplit heads,B=%d,T=%d,D=%d,H=%d,E=%d,causal=%s,bias=%s]" % (
            "tf32," if tf32 else "", B, T, D, H, E, causal, bias)
        run_case(probe, rep, name, "attention", attrs, [rand(B, T, D)], params,
                 lambda i, p: parts(i, p)[0],
                 lambda i, p: [(t, "f32") for t in parts(i, p)[1:]], extra=extra, tol=tol)
        if T < 100:
            split_cases(probe, rep, name, "attention", attrs, [rand(B, T, D)], params,
                        lambda i, p: parts(i, p)[0], extra=extra, tol=tol)


def act_ref(h, act):
    return {"gelu": lambda t: F.gelu(t, approximate="tanh"), "gelu_exact": F.gelu,
            "relu": F.relu, "silu": F.silu}[act](h)


def fam_mlp(probe, rep):
    for shape, hidden, act in [((4, 6), 10, "gelu"), ((2, 9, 32), 128, "gelu"),
                               ((3, 5, 16), 24, "relu"), ((7, 12), 33, "silu"),
                               ((2, 64, 64), 256, "gelu"), ((2, 9, 32), 128, "gelu_exact")]:
        d = shape[-1]
        x = rand(*shape)
        params = [rand(hidden, d, scale=d ** -0.5), 0.1 * rand(hidden),
                  rand(d, hidden, scale=hidden ** -0.5), 0.1 * rand(d)]
        h_of = lambda i, p: i[0] @ p[0].t() + p[1]
        run_case(probe, rep, "mlp[%s,F=%d,%s]" % (shape, hidden, act), "mlp",
                 {"hidden": hidden, "act": act}, [x], params,
                 lambda i, p: act_ref(h_of(i, p), act) @ p[2].t() + p[3],
                 lambda i, p: [(h_of(i, p), "f32")])
    x = rand(3, 8)
    params = [rand(12, 8), rand(12), rand(8, 12), rand(8)]
    run_case(probe, rep, "mlp[accumulate]", "mlp", {"hidden": 12}, [x], params,
             lambda i, p: act_ref(i[0] @ p[0].t() + p[1], "gelu") @ p[2].t() + p[3],
             accumulate=True)
    split_cases(probe, rep, "mlp", "mlp", {"hidden": 12}, [x], params,
                lambda i, p: act_ref(i[0] @ p[0].t() + p[1], "gelu") @ p[2].t() + p[3])


# moe's four ops, each against a reference written from the specification in
# backend/cpu/Moe.cpp's header (routing, capacity, layout of the dispatched rows, the
# load-balancing loss), not from its loops. Inputs are built as the pipeline feeds them:
# gates from a softmax, the experts' rows and counts from an actual routing.


class MoeRouting:
    """The routing of gates [B, ..., E] (B samples of T tokens, N tokens in all):
    choice [N, k] the experts of each token's slots, kept [N, k], row [N, k] each copy's
    row among the dispatched rows (-1 when dropped), source [rows in use] the token of each
    dispatched row, counts [E] rows per expert, chosen [B, E] each sample's choices before
    the capacity, dropped."""

    def __init__(self, gates, k, capacity_factor):
        B, E = gates.shape[0], gates.shape[-1]
        g = gates.detach().reshape(-1, E)
        N = g.shape[0]
        T = N // B
        cap = math.ceil(capacity_factor * T * k / E) if capacity_factor > 0 else T * k
        # 1. The k largest gates; a stable sort sends ties to the lower expert.
        self.choice = torch.sort(g, dim=-1, descending=True, stable=True).indices[:, :k]
        # 2. Each copy's place in its expert's queue of the sample, slot 0 of every token
        #    first (GShard's cumsum over the one-hot choices in priority order).
        onehot = F.one_hot(self.choice.reshape(B, T, k), E)  # [B, T, k, E]
        queue = onehot.transpose(1, 2).reshape(B, k * T, E)
        place = (queue.cumsum(1) * queue).sum(-1) - 1  # [B, k T], 0-based
        self.kept = (place < cap).reshape(B, k, T).transpose(1, 2).reshape(N, k)
        self.chosen = onehot.sum((1, 2)).double()  # [B, E]
        # 3. The kept copies sorted by (expert, sample, slot, token).
        token = torch.arange(N)
        key = (self.choice * (N * k) + (token // T * k)[:, None] * T +
               torch.arange(k)[None, :] * T + (token % T)[:, None])
        key = key.masked_fill(~self.kept, N * k * (E + 1))
        order = torch.argsort(key.reshape(-1))  # flat copies t k + s, kept ones first
        used = int(self.kept.sum())
        self.row = torch.full((N * k,), -1, dtype=torch.long)
        self.row[order[:used]] = torch.arange(used)
        self.row = self.row.reshape(N, k)
        self.source = order[:used] // k
        self.counts = torch.bincount(self.choice[self.kept], minlength=E)
        self.dropped = N * k - used
        self.n, self.t, self.k, self.e = N, T, k, E


def moe_rows_shape(x_shape, k):
    """[B, ..., D] -> the dispatched rows [B, R k, D]."""
    return (x_shape[0], math.prod(x_shape[1:-1]) * k, x_shape[-1])


def moe_dispatch_ref(x, gates, r):
    """(rows, aux): the kept copies of the tokens grouped as routed, zeros after them; and
    the sum over samples of E sum_e f_e P_e, f_e (a count, no gradient) the share of the
    sample's T k choices that went to e, P_e the sample's mean gate of e."""
    D = x.shape[-1]
    xs = x.reshape(-1, D)
    pad = torch.zeros(r.n * r.k - len(r.source), D, dtype=x.dtype)
    rows = torch.cat([xs[r.source], pad]).reshape(moe_rows_shape(x.shape, r.k))
    f = r.chosen / (r.t * r.k)
    p = gates.reshape(-1, r.t, r.e).mean(1)
    return rows, (r.e * f * p).sum()


def moe_combine_ref(rows, gates, r):
    """Each token's kept copies' rows times their gates renormalised over its k choices
    (dropped ones included), added in slot order."""
    D = rows.shape[-1]
    flat = rows.reshape(-1, D)
    g = gates.reshape(-1, r.e)
    sel = g.gather(1, r.choice)
    w = sel / sel.sum(-1, keepdim=True)
    y = torch.zeros(r.n, D, dtype=rows.dtype)
    for s in range(r.k):
        kept = r.kept[:, s]
        y = y + torch.where(kept[:, None], w[:, s:s + 1] * flat[r.row[:, s].clamp(min=0)], 0.0)
    return y.reshape(*gates.shape[:-1], D)


def moe_experts_ref(rows, counts, w1, b1, w2, b2):
    """(y, h): expert e's block of rows (after the blocks of the experts before it) through
    gelu(rows W1_e^T + b1_e) W2_e^T + b2_e, h the first linear; rows after the blocks give 0."""
    D, Fh = rows.shape[-1], w1.shape[1]
    flat = rows.reshape(-1, D)
    ys, hs, at = [], [], 0
    for e in range(w1.shape[0]):
        block = flat[at:at + int(counts[e])]
        at += int(counts[e])
        h = block @ w1[e].t() + b1[e]
        hs.append(h)
        ys.append(act_ref(h, "gelu") @ w2[e].t() + b2[e])
    ys.append(torch.zeros(flat.shape[0] - at, D, dtype=rows.dtype))
    hs.append(torch.zeros(flat.shape[0] - at, Fh, dtype=rows.dtype))
    return torch.cat(ys).reshape(rows.shape), torch.cat(hs).reshape(*rows.shape[:-1], Fh)


def moe_gates(lead, E, skew=0.0, unused=None):
    """Router-like gates [*lead, E]: a softmax of random logits; skew favours expert 0 (so
    a capacity drops copies), `unused` an expert no token picks."""
    logits = rand(*lead, E) * 1.5
    logits[..., 0] += skew
    if unused is not None:
        logits[..., unused] -= 12
    return torch.softmax(logits, -1)


def moe_dispatch_case(probe, rep, name, x, gates, k, cf, aux_weight=0.01, sample_weight=0.125,
                      accumulate=False, want=None, expect_drops=None):
    attrs = {"experts": gates.shape[-1], "top_k": k, "capacity_factor": cf,
             "aux_weight": aux_weight}
    r = MoeRouting(gates, k, cf)
    if expect_drops is not None:  # the case is built to (not) exercise the capacity
        assert (r.dropped > 0) == expect_drops, "%s: %d dropped" % (name, r.dropped)
    x64, g64 = x.double().requires_grad_(), gates.double().requires_grad_()
    rows, aux = moe_dispatch_ref(x64, g64, r)
    drows = rand(*rows.shape)
    # The backward adds the load-balancing loss's gradient, aux_weight x sample weight x aux.
    ((rows * drows.double()).sum() + aux_weight * sample_weight * aux).backward()
    refs = [x64.grad, g64.grad]
    acc_flags, acc_init = None, None
    if accumulate:
        acc_flags, acc_init = [True, True], [rand(*x.shape), rand(*gates.shape)]
    o, _, grads = probe.op("moe_dispatch", attrs, [x, gates], [], tuple(rows.shape), (), drows,
                           acc_flags, acc_init, want, extra={"sample_weight": sample_weight})
    counts, stats = probe.out(1, (r.e,), "i32"), probe.out(2, (4,))
    rep.check(name, "rows", o, rows)
    rep.expect(name, "counts", torch.equal(counts.long(), r.counts),
               "%s, reference %s" % (counts.tolist(), r.counts.tolist()))
    rep.check(name, "stats aux", stats[0:1], aux.detach().reshape(1))
    want_stats = [float(r.dropped), float(r.n * r.k), float(gates.shape[0])]
    rep.expect(name, "stats counts", stats[1:].tolist() == want_stats,
               "dropped, copies, samples %s, reference %s" % (stats[1:].tolist(), want_stats))
    for i, (label, g, ref) in enumerate(zip(["d_x", "d_gates"], grads, refs)):
        if want is not None and not want[i]:
            continue
        rep.check(name, label, g, ref + acc_init[i].double() if accumulate else ref)


def moe_combine_inputs(lead, D, E, k, cf, skew=0.0):
    """gates, and expert outputs laid out as their routing dispatched them, zero after."""
    gates = moe_gates(lead, E, skew)
    r = MoeRouting(gates, k, cf)
    rows = rand(*moe_rows_shape(lead + (D,), k))
    rows.view(-1, D)[len(r.source):] = 0
    return rows, gates, r


def moe_experts_inputs(lead, D, E, k, cf, unused=None, local=None):
    """Rows and counts from a dispatch of random tokens; with local = (first, El) the rows
    of experts first .. first + El - 1 alone, at the start, as the device holding them gets
    them when the experts are split."""
    x, gates = rand(*lead, D), moe_gates(lead, E, 1.0, unused)
    r = MoeRouting(gates, k, cf)
    rows = moe_dispatch_ref(x.double(), gates.double(), r)[0].float()
    counts = r.counts
    if local is not None:
        first, el = local
        start, n = int(counts[:first].sum()), int(counts[first:first + el].sum())
        flat = rows.view(-1, D)
        mine = torch.zeros_like(flat)
        mine[:n] = flat[start:start + n]
        rows, counts = mine.reshape(rows.shape), counts[first:first + el]
    return rows, counts.to(torch.int32), r


def moe_experts_params(El, D, Fh):
    return [rand(El, Fh, D, scale=D ** -0.5), 0.1 * rand(El, Fh), rand(El, D, Fh, scale=Fh ** -0.5),
            0.1 * rand(El, D)]


def fam_moe(probe, rep):
    # moe_router: softmax(x Wr^T).
    router = lambda i, p: torch.softmax(i[0] @ p[0].t(), -1)
    for shape, E in [((5, 8), 4), ((2, 9, 16), 3), ((2, 7, 12), 5), ((4, 32, 32), 8)]:
        run_case(probe, rep, "moe_router[%s,E=%d]" % (shape, E), "moe_router", {"experts": E},
                 [rand(*shape)], [rand(E, shape[-1])], router)
    x, wr = rand(3, 6, 8), rand(4, 8)
    run_case(probe, rep, "moe_router[accumulate]", "moe_router", {"experts": 4}, [x], [wr],
             router, accumulate=True)
    split_cases(probe, rep, "moe_router", "moe_router", {"experts": 4}, [x], [wr], router)

    # moe_dispatch: shapes, E, k, capacity_factor, skew; whether copies are dropped.
    for lead, D, E, k, cf, skew, drops in [
            ((2, 6), 8, 4, 1, 0.0, 0.0, False), ((2, 6), 8, 4, 2, 0.0, 0.0, False),
            ((3, 5), 8, 5, 3, 0.0, 0.0, False), ((6,), 8, 4, 2, 0.0, 0.0, False),
            ((5,), 6, 3, 1, 0.5, 0.0, False), ((2, 3, 2), 6, 4, 2, 0.0, 0.0, False),
            ((3, 8), 6, 4, 2, 0.5, 0.0, True), ((2, 9), 6, 3, 1, 1.0, 1.5, True),
            ((4, 10), 5, 6, 3, 1.25, 1.0, True), ((2, 12), 4, 4, 2, 1.0, 2.0, True),
            ((4, 32), 16, 8, 2, 1.25, 1.0, True), ((2, 3, 2), 6, 4, 2, 0.75, 1.0, True)]:
        name = "moe_dispatch[%s,D=%d,E=%d,k=%d,cf=%g]" % (lead, D, E, k, cf)
        moe_dispatch_case(probe, rep, name, rand(*lead, D), moe_gates(lead, E, skew), k, cf,
                          expect_drops=drops)
    x, gates = rand(3, 8, 6), moe_gates((3, 8), 4, 1.0)
    for aw, sw in [(0.5, 0.25), (0.01, 0.0)]:  # a large load-balancing gradient; none
        moe_dispatch_case(probe, rep, "moe_dispatch[aux_weight=%g,sample_weight=%g]" % (aw, sw),
                          x, gates, 2, 1.0, aux_weight=aw, sample_weight=sw)
    moe_dispatch_case(probe, rep, "moe_dispatch[accumulate]", x, gates, 2, 1.0, aux_weight=0.5,
                      accumulate=True, expect_drops=True)
    moe_dispatch_case(probe, rep, "moe_dispatch[d_gates only]", x, gates, 2, 1.0, aux_weight=0.5,
                      want=[False, True])

    # moe_combine: expert outputs in the dispatched layout.
    for lead, D, E, k, cf, skew in [
            ((2, 6), 8, 4, 1, 0.0, 0.0), ((2, 6), 8, 4, 2, 0.0, 0.0), ((3, 5), 8, 5, 3, 0.0, 0.0),
            ((6,), 8, 4, 2, 0.0, 0.0), ((2, 3, 2), 6, 4, 2, 0.0, 0.0),
            ((3, 8), 6, 4, 2, 0.5, 0.0), ((2, 9), 6, 3, 1, 1.0, 1.5), ((4, 10), 5, 6, 3, 1.25, 1.0),
            ((4, 32), 16, 8, 2, 1.25, 1.0)]:
        rows, gates, r = moe_combine_inputs(lead, D, E, k, cf, skew)
        attrs = {"experts": E, "top_k": k, "capacity_factor": cf}
        run_case(probe, rep, "moe_combine[%s,D=%d,E=%d,k=%d,cf=%g,dropped=%d]" %
                 (lead, D, E, k, cf, r.dropped), "moe_combine", attrs, [rows, gates], [],
                 lambda i, p, r=r: moe_combine_ref(i[0], i[1], r))
    rows, gates, r = moe_combine_inputs((3, 8), 6, 4, 2, 1.0, 1.0)
    run_case(probe, rep, "moe_combine[accumulate]", "moe_combine",
             {"experts": 4, "top_k": 2, "capacity_factor": 1.0}, [rows, gates], [],
             lambda i, p: moe_combine_ref(i[0], i[1], r), accumulate=True)

    # moe_experts: rows and counts of a dispatch (with trailing unused rows where copies were
    # dropped, an expert without rows where one is unused), every expert or a split's piece.
    experts = lambda i, p: moe_experts_ref(i[0], i[1], *p)[0]
    experts_h = lambda i, p: [(moe_experts_ref(i[0], i[1], *p)[1], "f32")]
    for lead, D, E, Fh, k, cf, unused, local in [
            ((2, 6), 8, 4, 6, 1, 0.0, None, None), ((2, 6), 8, 4, 6, 2, 0.0, None, None),
            ((3, 5), 12, 5, 10, 3, 0.0, None, None), ((6,), 8, 3, 5, 2, 0.0, None, None),
            ((3, 8), 8, 4, 6, 2, 1.0, None, None), ((2, 9), 16, 4, 32, 2, 0.75, 2, None),
            ((4, 32), 32, 8, 64, 2, 1.25, 5, None), ((2, 9), 8, 4, 6, 2, 1.0, None, (2, 2)),
            ((3, 8), 8, 6, 10, 2, 0.0, 4, (3, 3)), ((2, 6), 8, 4, 6, 3, 0.0, None, (0, 1))]:
        rows, counts, r = moe_experts_inputs(lead, D, E, k, cf, unused, local)
        El = E if local is None else local[1]
        used = int(counts.sum())
        name = "moe_experts[%s,D=%d,E=%d,F=%d,k=%d,cf=%g,%s]" % (
            lead, D, E, Fh, k, cf, "rows %d of %d, counts %s" % (used, rows.numel() // D,
                                                                 counts.tolist()))
        run_case(probe, rep, name, "moe_experts", {"experts": E, "hidden": Fh}, [rows, counts],
                 moe_experts_params(El, D, Fh), experts, experts_h,
                 extra={"param_pieces": True} if local is not None else None)
    rows, counts, r = moe_experts_inputs((3, 8), 8, 4, 2, 0.75, 3)
    params = moe_experts_params(4, 8, 6)
    run_case(probe, rep, "moe_experts[accumulate]", "moe_experts", {"experts": 4, "hidden": 6},
             [rows, counts], params, experts, experts_h, accumulate=True)
    split_cases(probe, rep, "moe_experts", "moe_experts", {"experts": 4, "hidden": 6},
                [rows, counts], params, experts)
    rows, counts, r = moe_experts_inputs((3, 8), 8, 6, 2, 0.0, 4, (3, 3))
    split_cases(probe, rep, "moe_experts[piece]", "moe_experts", {"experts": 6, "hidden": 6},
                [rows, counts], moe_experts_params(3, 8, 6), experts,
                extra={"param_pieces": True})


def fam_conv(probe, rep):
    for (B, C, H, W), co, k, st, pad, bias in [
            ((1, 1, 5, 5), 1, 3, 1, 0, True), ((2, 3, 8, 7), 4, 3, 1, 1, True),
            ((2, 3, 9, 9), 5, 3, 2, 1, False), ((1, 4, 11, 6), 3, 5, 3, 2, True),
            ((3, 2, 6, 6), 6, 1, 1, 0, True), ((2, 16, 14, 14), 32, 3, 1, 1, True),
            ((1, 2, 4, 4), 3, 4, 1, 0, True),
            # "same" padding wider than the image's rows, and than the image itself
            ((2, 3, 5, 6), 2, 5, 1, 2, True), ((1, 2, 3, 2), 2, 5, 1, 2, False),
            # 9 groups of images in oneDNN's convolution, the last of one image alone
            ((17, 3, 8, 8), 10, 3, 1, 1, True),
            # 16 groups in 15 lanes (ir::convDirectPlan's budget): lane 0 runs two
            ((16, 1, 128, 128), 2, 3, 1, 1, True)]:
        x = rand(B, C, H, W)
        params = [rand(co, C, k, k, scale=(C * k * k) ** -0.5)] + ([rand(co)] if bias else [])
        run_case(probe, rep, "conv2d[%s,co=%d,k=%d,s=%d,p=%d]" % ((B, C, H, W), co, k, st, pad),
                 "conv2d", {"channels": co, "kernel": k, "stride": st, "padding": pad,
                            "bias": bias}, [x], params,
                 lambda i, p: F.conv2d(i[0], p[0], p[1] if len(p) > 1 else None, st, pad))
    x = rand(2, 3, 6, 6)
    run_case(probe, rep, "conv2d[accumulate]", "conv2d",
             {"channels": 2, "kernel": 3, "padding": 1}, [x], [rand(2, 3, 3, 3), rand(2)],
             lambda i, p: F.conv2d(i[0], p[0], p[1], 1, 1), accumulate=True)
    x = rand(3, 3, 6, 6)  # three images: several im2col groups when the group is small
    split_cases(probe, rep, "conv2d", "conv2d", {"channels": 2, "kernel": 3, "padding": 1}, [x],
                [rand(2, 3, 3, 3), rand(2)], lambda i, p: F.conv2d(i[0], p[0], p[1], 1, 1))


def fam_pooling(probe, rep):
    for shape, k, st in [((1, 1, 4, 4), 2, 0), ((2, 3, 7, 9), 2, 0), ((2, 2, 9, 9), 3, 2),
                         ((1, 3, 8, 8), 3, 1), ((2, 4, 6, 5), 2, 3), ((1, 1, 5, 5), 5, 0)]:
        x = rand(*shape)
        s = st if st else k
        def argmax(i, p):
            _, idx = F.max_pool2d(i[0], k, s, return_indices=True)
            return [(idx, "i32")]
        run_case(probe, rep, "max_pool[%s,k=%d,s=%d]" % (shape, k, st), "max_pool",
                 {"kernel": k, "stride": st}, [x], [], lambda i, p: F.max_pool2d(i[0], k, s),
                 argmax)
        run_case(probe, rep, "avg_pool[%s,k=%d,s=%d]" % (shape, k, st), "avg_pool",
                 {"kernel": k, "stride": st}, [x], [], lambda i, p: F.avg_pool2d(i[0], k, s))
    x = rand(2, 2, 6, 6)
    run_case(probe, rep, "max_pool[accumulate]", "max_pool", {"kernel": 3, "stride": 1}, [x], [],
             lambda i, p: F.max_pool2d(i[0], 3, 1), accumulate=True)
    run_case(probe, rep, "avg_pool[accumulate]", "avg_pool", {"kernel": 3, "stride": 1}, [x], [],
             lambda i, p: F.avg_pool2d(i[0], 3, 1), accumulate=True)


def fam_activations(probe, rep):
    refs = {"gelu": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu, "silu": F.silu,
            "tanh": torch.tanh, "sigmoid": torch.sigmoid, "softmax": lambda t: t.softmax(-1)}
    for op, fn in refs.items():
        for shape in [(7,), (3, 5), (4, 33, 17), (2, 100000)]:
            x = rand(*shape) * 3
            run_case(probe, rep, "%s[%s]" % (op, shape), op, {}, [x], [],
                     lambda i, p, fn=fn: fn(i[0]))
        run_case(probe, rep, "%s[accumulate]" % op, op, {}, [rand(4, 9)], [],
                 lambda i, p, fn=fn: fn(i[0]), accumulate=True)
    x = rand(3, 8) * 40  # saturating inputs
    for op in ["gelu", "silu", "tanh", "sigmoid", "softmax"]:
        run_case(probe, rep, "%s[large inputs]" % op, op, {}, [x], [],
                 lambda i, p, fn=refs[op]: fn(i[0]))
    # The exact form (PyTorch's default), and the tanh form named.
    for shape in [(7,), (4, 33, 17), (2, 100000)]:
        run_case(probe, rep, "gelu[approx=none,%s]" % (shape,), "gelu", {"approx": "none"},
                 [rand(*shape) * 3], [], lambda i, p: F.gelu(i[0]))
    run_case(probe, rep, "gelu[approx=none,large inputs]", "gelu", {"approx": "none"}, [x], [],
             lambda i, p: F.gelu(i[0]))
    run_case(probe, rep, "gelu[approx=none,accumulate]", "gelu", {"approx": "none"},
             [rand(4, 9)], [], lambda i, p: F.gelu(i[0]), accumulate=True)
    run_case(probe, rep, "gelu[approx=tanh]", "gelu", {"approx": "tanh"}, [rand(3, 5) * 3], [],
             lambda i, p: F.gelu(i[0], approximate="tanh"))


def fam_elementwise(probe, rep):
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
    shapes = [((3, 4), (3, 4)), ((2, 5, 8), (5, 8)), ((5, 8), (2, 5, 8)), ((4, 1, 6), (1, 3, 1)),
              ((4, 6), (6,)), ((4, 6), (4, 1)), ((2, 3, 4, 5), (3, 1, 5)), ((7,), (1,)),
              ((1,), (3, 2)), ((2, 1, 3), (2, 4, 1)), ((32, 128, 64), (128, 64))]
    for op, fn in ops.items():
        for sa, sb in shapes:
            run_case(probe, rep, "%s[%s,%s]" % (op, sa, sb), op, {}, [rand(*sa), rand(*sb)], [],
                     lambda i, p, fn=fn: fn(i[0], i[1]))
        run_case(probe, rep, "%s[accumulate]" % op, op, {}, [rand(3, 4), rand(4)], [],
                 lambda i, p, fn=fn: fn(i[0], i[1]), accumulate=True)
    a, b = torch.randint(-50, 50, (3, 4), dtype=torch.int32), torch.randint(-50, 50, (4,),
                                                                            dtype=torch.int32)
    for op, fn in ops.items():
        o, _, _ = probe.op(op, {}, [a, b], [], (3, 4), backward=False)
        rep.expect("%s[i32]" % op, "out", torch.equal(o.view(torch.int32), fn(a, b)))
    t = torch.randint(-50, 50, (2, 3, 5), dtype=torch.int32)
    o, _, _ = probe.op("transpose", {"dim0": 0, "dim1": 2}, [t], [], (5, 3, 2), backward=False)
    rep.expect("transpose[i32]", "out", torch.equal(o.view(torch.int32), t.transpose(0, 2)))
    for shape, f in [((3, 4), 0.5), ((2, 3, 70000), -1.25)]:
        run_case(probe, rep, "scale[%s,%g]" % (shape, f), "scale", {"factor": f}, [rand(*shape)],
                 [], lambda i, p: i[0] * f)
    run_case(probe, rep, "scale[accumulate]", "scale", {"factor": 3.0}, [rand(5)], [],
             lambda i, p: i[0] * 3.0, accumulate=True)
    for shape in [(2, 3, 4), (5, 2, 2, 3)]:
        run_case(probe, rep, "flatten[%s]" % (shape,), "flatten", {}, [rand(*shape)], [],
                 lambda i, p, s=shape: i[0].reshape(s[0], -1))
    for shape, to in [((2, 3, 4), [6, -1]), ((4, 6), [2, 2, 6]), ((2, 3, 4), [24])]:
        run_case(probe, rep, "reshape[%s->%s]" % (shape, to), "reshape", {"shape": to},
                 [rand(*shape)], [], lambda i, p, to=to: i[0].reshape(to))
    run_case(probe, rep, "reshape[accumulate]", "reshape", {"shape": [3, 2]}, [rand(2, 3)], [],
             lambda i, p: i[0].reshape(3, 2), accumulate=True)
    for shape, d0, d1 in [((3, 4), 0, 1), ((2, 3, 4), 1, 2), ((2, 3, 4, 5), 0, 2),
                          ((2, 3, 4, 5), -1, -3), ((2, 3), 1, 1), ((4, 2, 8, 16), 1, 2)]:
        run_case(probe, rep, "transpose[%s,%d,%d]" % (shape, d0, d1), "transpose",
                 {"dim0": d0, "dim1": d1}, [rand(*shape)], [],
                 lambda i, p, d0=d0, d1=d1: i[0].transpose(d0, d1))
    run_case(probe, rep, "transpose[accumulate]", "transpose", {"dim0": 0, "dim1": 1},
             [rand(3, 5)], [], lambda i, p: i[0].transpose(0, 1), accumulate=True)


def fam_slicing(probe, rep):
    """mean over a dim, select and narrow of its indices; negative dims and indices count
    from the end, as in torch."""
    for shape, d, keep in [((4, 6), 1, False), ((2, 5, 8), 1, False), ((2, 5, 8), -1, False),
                           ((2, 5, 8), 2, True), ((3, 4, 5, 6), -3, False),
                           ((3, 4, 5, 6), 2, True), ((2, 1, 3), 1, False), ((2, 300, 70), 1, False)]:
        run_case(probe, rep, "mean[%s,%d%s]" % (shape, d, ",keepdim" if keep else ""), "mean",
                 {"dim": d, "keepdim": keep}, [rand(*shape)], [],
                 lambda i, p, d=d, keep=keep: i[0].mean(d, keepdim=keep))
    run_case(probe, rep, "mean[accumulate]", "mean", {"dim": 1}, [rand(3, 4, 5)], [],
             lambda i, p: i[0].mean(1), accumulate=True)
    for shape, d, idx in [((2, 5, 8), 1, 0), ((2, 5, 8), 1, -1), ((2, 5, 8), -1, 3),
                          ((3, 4, 5, 6), 2, 4), ((4, 6), 1, 5), ((2, 1, 3), 1, 0),
                          ((2, 128, 64), 1, 0)]:
        run_case(probe, rep, "select[%s,%d,%d]" % (shape, d, idx), "select",
                 {"dim": d, "index": idx}, [rand(*shape)], [],
                 lambda i, p, d=d, idx=idx: i[0].select(d, idx))
    run_case(probe, rep, "select[accumulate]", "select", {"dim": 1, "index": 2}, [rand(3, 4, 5)],
             [], lambda i, p: i[0].select(1, 2), accumulate=True)
    for shape, d, start, n in [((2, 5, 8), 1, 0, 1), ((2, 5, 8), 1, 1, 3), ((2, 5, 8), -1, 2, 6),
                               ((3, 4, 5, 6), 2, -2, 2), ((4, 6), 1, 0, 6), ((3, 4, 5, 6), 1, 3, 1),
                               ((2, 128, 64), 1, 5, 100)]:
        run_case(probe, rep, "narrow[%s,%d,%d,%d]" % (shape, d, start, n), "narrow",
                 {"dim": d, "start": start, "length": n}, [rand(*shape)], [],
                 lambda i, p, d=d, start=start, n=n: i[0].narrow(d, start, n))
    run_case(probe, rep, "narrow[accumulate]", "narrow", {"dim": 1, "start": 1, "length": 2},
             [rand(3, 4, 5)], [], lambda i, p: i[0].narrow(1, 1, 2), accumulate=True)
    t = torch.randint(-50, 50, (2, 5, 3), dtype=torch.int32)
    o, _, _ = probe.op("select", {"dim": 1, "index": -2}, [t], [], (2, 3), backward=False)
    rep.expect("select[i32]", "out", torch.equal(o.view(torch.int32), t.select(1, -2)))
    o, _, _ = probe.op("narrow", {"dim": 1, "start": 1, "length": 3}, [t], [], (2, 3, 3),
                       backward=False)
    rep.expect("narrow[i32]", "out", torch.equal(o.view(torch.int32), t.narrow(1, 1, 3)))


def fam_losses(probe, rep):
    # GPT-2's 50,257 classes: the exponentials' sum over many blocks and a tail (Lanes.h).
    for lead, V in [((4,), 5), ((2, 7), 13), ((3, 64), 256), ((1,), 1), ((2, 33), 1000),
                    ((3,), 50257)]:
        logits = rand(*lead, V) * 3
        tgt = torch.randint(0, V, lead, dtype=torch.int32)
        run_case(probe, rep, "cross_entropy[%s,V=%d]" % (lead, V), "cross_entropy", {},
                 [logits, tgt], [],
                 lambda i, p, V=V: F.cross_entropy(i[0].reshape(-1, V), i[1].reshape(-1)),
                 lambda i, p: [(torch.logsumexp(i[0], -1), "f32")])
    run_case(probe, rep, "cross_entropy[accumulate]", "cross_entropy", {},
             [rand(3, 4), torch.randint(0, 4, (3,), dtype=torch.int32)], [],
             lambda i, p: F.cross_entropy(i[0], i[1]), accumulate=True)
    # ignore_index: rows whose target is that class count nothing, as PyTorch's ignore_index
    # (the mean is over the rest); when every row is ignored the loss is 0 with no gradient,
    # where PyTorch's mean is NaN.
    ce = lambda k, V: lambda i, p: F.cross_entropy(i[0].reshape(-1, V), i[1].reshape(-1),
                                                   ignore_index=k)
    lse = lambda i, p: [(torch.logsumexp(i[0], -1), "f32")]
    tgt = torch.tensor([[1, 3, 0, 3], [3, 2, 3, 4]], dtype=torch.int32)
    run_case(probe, rep, "cross_entropy[ignore_index=3]", "cross_entropy", {"ignore_index": 3},
             [rand(2, 4, 5) * 3, tgt], [], ce(3, 5), lse)
    run_case(probe, rep, "cross_entropy[ignore_index=0,V=1000]", "cross_entropy",
             {"ignore_index": 0}, [rand(3, 40, 1000) * 3,
                                   torch.randint(0, 4, (3, 40), dtype=torch.int32)], [],
             ce(0, 1000), lse)
    run_case(probe, rep, "cross_entropy[ignore_index,accumulate]", "cross_entropy",
             {"ignore_index": 2}, [rand(6, 4), torch.tensor([2, 0, 1, 2, 3, 2], dtype=torch.int32)],
             [], ce(2, 4), accumulate=True)
    run_case(probe, rep, "cross_entropy[every target ignored]", "cross_entropy",
             {"ignore_index": 1}, [rand(3, 4), torch.ones(3, dtype=torch.int32)], [],
             lambda i, p: (i[0] * 0).sum(), lse)
    for shape in [(5,), (3, 4), (2, 50, 300)]:
        run_case(probe, rep, "mse[%s]" % (shape,), "mse", {}, [rand(*shape), rand(*shape)], [],
                 lambda i, p: F.mse_loss(i[0], i[1]))
    run_case(probe, rep, "mse[accumulate]", "mse", {}, [rand(3, 4), rand(3, 4)], [],
             lambda i, p: F.mse_loss(i[0], i[1]), accumulate=True)


def fam_optimizers(probe, rep):
    f32 = lambda v: float(np.float32(v))
    configs = [
        ("sgd", dict(lr=0.1), {}),
        ("sgd", dict(lr=0.05, momentum=0.9), {}),
        ("sgd", dict(lr=0.05, momentum=0.9, weight_decay=0.01), {"grad_scale": 0.25}),
        ("adam", dict(lr=1e-3), {}),
        ("adam", dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1), {}),
        ("adamw", dict(lr=3e-4, weight_decay=0.1), {}),
        ("adamw", dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01), {"grad_scale": 0.5}),
    ]
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    for kind, hp, extra in configs:
        if kind != "sgd":
            hp.setdefault("betas", (0.9, 0.999))  # rounded to f32 below, as the call holds them
        hp = {k: (tuple(f32(x) for x in v) if isinstance(v, tuple) else f32(v))
              for k, v in hp.items()}
        gs = f32(extra.get("grad_scale", 1.0))
        shape, steps = (37, 53), 6
        p0 = rand(*shape)
        grads = [rand(*shape) for _ in range(steps)]
        probe.new_dir()
        case = {"mode": "optimizer", "kind": kind, "shape": list(shape), "grad_scale": gs,
                "param": probe._write(p0, "p.bin"),
                "grads": [probe._write(g, "g%d.bin" % i) for i, g in enumerate(grads)],
                "lr": hp["lr"], "weight_decay": hp.get("weight_decay", 0.0),
                "momentum": hp.get("momentum", 0.0), "eps": hp.get("eps", f32(1e-8))}
        if "betas" in hp:
            case["beta1"], case["beta2"] = hp["betas"]
        probe.run_json(case)
        p = p0.clone().requires_grad_()
        opt = cls[kind]([p], **hp)
        for g in grads:
            p.grad = g * gs
            opt.step()
        name = "%s[%s]" % (kind, ",".join("%s=%s" % kv for kv in sorted(hp.items())) +
                           (",gs=%g" % gs if gs != 1 else ""))
        rep.check(name, "param", probe._read("param.bin", shape), p)
        st = opt.state[p]
        if kind == "sgd" and "momentum" in hp:
            rep.check(name, "momentum", probe._read("state1.bin", shape), st["momentum_buffer"])
        if kind != "sgd":
            rep.check(name, "exp_avg", probe._read("state1.bin", shape), st["exp_avg"])
            rep.check(name, "exp_avg_sq", probe._read("state2.bin", shape), st["exp_avg_sq"])
    for n in [7, 100003]:
        x = rand(n)
        probe.new_dir()
        probe.run_json({"mode": "reduce", "shape": [n], "x": probe._write(x, "x.bin"),
                        "init": 2.5, "factor": 0.3})
        r = probe._read("sumsq.bin", (2,))
        ss = x.double().pow(2).sum()
        rep.check("sum_squares[n=%d]" % n, "plain", r[0:1], ss.reshape(1))
        rep.check("sum_squares[n=%d]" % n, "accumulate", r[1:2], (ss + 2.5).reshape(1))
        rep.check("scale_in_place[n=%d]" % n, "x", probe._read("scaled.bin", (n,)),
                  x.double() * float(np.float32(0.3)))


def run_dropout(probe, x, dy, p, seed, training=True, cut=None):
    """dropout of x and its backward of dy: (y, dx)."""
    probe.new_dir()
    case = {"op": "dropout", "attrs": {"p": p}, "training": training, "seed": seed,
            "repeat": 2, "params": [], "dy": probe._write(dy, "dy.bin"),
            "inputs": [{"shape": list(x.shape), "path": probe._write(x, "x.bin")}]}
    if cut:
        case["cut"] = cut
    probe.run_json(case)
    return probe._read("out.bin", x.shape), probe._read("grad0.bin", x.shape)


def fam_dropout(probe, rep):
    n, p = 200000, 0.3
    x = rand(4, n // 4).abs() + 0.5  # never zero, so a zero in y means dropped
    dy = rand(4, n // 4)
    def run(seed, training=True):
        return run_dropout(probe, x, dy, p, seed, training)
    y, dx = run(1234)
    dropped = (y == 0)
    frac = float(dropped.double().mean())
    sigma = math.sqrt(p * (1 - p) / n)
    rep.expect("dropout[p=0.3]", "fraction", abs(frac - p) < 5 * sigma,
               "zeroed %.4f, expected %.2f +- %.4f" % (frac, p, 5 * sigma))
    rep.check("dropout[p=0.3]", "kept values", y[~dropped], x[~dropped].double() / (1 - p))
    rep.expect("dropout[p=0.3]", "grad mask", torch.equal(dx == 0, dropped))
    rep.check("dropout[p=0.3]", "grad values", dx[~dropped], dy[~dropped].double() / (1 - p))
    y2, _ = run(1234)
    rep.expect("dropout[p=0.3]", "same seed", torch.equal(y, y2))
    y3, _ = run(1235)
    overlap = float(((y3 == 0) & dropped).double().mean())
    rep.expect("dropout[p=0.3]", "other seed", not torch.equal(y3 == 0, dropped) and
               abs(overlap - p * p) < 5 * sigma, "both dropped %.4f, expected %.3f" %
               (overlap, p * p))
    y4, dx4 = run(1234, training=False)
    rep.expect("dropout[eval]", "identity", torch.equal(y4, x) and torch.equal(dx4, dy))
    run_case(probe, rep, "dropout[p=0]", "dropout", {"p": 0.0}, [rand(3, 5)], [],
             lambda i, p: i[0] * 1.0)
    # A piece of a tensor cut over a split group (its last dim, in 4): the mask of the whole
    # tensor's elements, so the piece's results are the whole's columns, bit for bit.
    rows, width, pieces = 6, 1000, 4
    whole, dwhole = rand(rows, pieces * width).abs() + 0.5, rand(rows, pieces * width)
    y, dx = run_dropout(probe, whole, dwhole, p, 99)
    for index in (0, 2):
        cols = slice(index * width, (index + 1) * width)
        yp, dxp = run_dropout(probe, whole[:, cols].contiguous(), dwhole[:, cols].contiguous(), p,
                              99, cut=[width, pieces, index])
        name = "dropout[cut piece %d of %d]" % (index, pieces)
        rep.expect(name, "the whole's mask", torch.equal(yp, y[:, cols]) and
                   torch.equal(dxp, dx[:, cols]))


FAMILIES = {name[4:]: fn for name, fn in globals().items() if name.startswith("fam_")}


def main():
    args = sys.argv[1:]
    device = "cpu"
    if len(args) == 4 and args[2] == "--device":
        device = args[3]
        args = args[:2]
    if len(args) != 2 or args[1] not in FAMILIES:
        print("usage: test_ops.py PROBE {%s} [--device cuda]" % "|".join(FAMILIES))
        return 2
    torch.manual_seed(20240)
    rep = Report()
    with tempfile.TemporaryDirectory(prefix="epl-oracle-") as tmp:
        probe = Probe(os.path.abspath(args[0]), tmp, device, rep)
        try:
            FAMILIES[args[1]](probe, rep)
        except NoDevice as e:
            print("skipped: %s" % e)
            return SKIP
        except RuntimeError as e:
            rep.failures.append(str(e))
            print("  " + str(e))
    print("max error per op on %s (tolerance %.0e):" % (device, TOL))
    for op, e in sorted(rep.worst.items()):
        print("  %-16s %.2e" % (op, e))
    if device != "cpu":
        print("max error of %s against cpu, every result file (tolerance %.0e): %.2e" %
              (device, CROSS_TOL, rep.cross_worst))
    if rep.failures:
        print("%d failure(s):\n  %s" % (len(rep.failures), "\n  ".join(rep.failures)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
