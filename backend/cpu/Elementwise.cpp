// Elementwise ops: add, sub, mul with NumPy broadcasting (either operand may broadcast),
// scale, flatten/reshape (a copy) and transpose of two dims. Under amp, add reads and
// writes its half-precision tensors as they are stored, a run at a time through f32
// (f32Run, outRun): the same bits as on widened copies.
//
// Shape legend: R rows and K columns of a collapsed broadcast; A, M, N the dims around two
// transposed ones ([A, I, M, J, N] -> [A, J, M, I, N]).
#include "backend/KernelShapes.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"

#include <algorithm>
#include <vector>

namespace epl::backend::cpu {

namespace {

enum class BinOp { Add, Sub, Mul };

// Elements a thread converts at a time where a kernel reads or writes half precision as
// stored: three runs of f32 in its L1 cache.
constexpr int64_t kRun = 1024;

// out = a op b as a loop nest (KernelShapes.h), the innermost loop as long as possible.
using Nest = BroadcastNest;

// Offsets of operands a and b for the first element of outer row r (all dims but the last).
void rowOffsets(const Nest& n, int64_t r, int64_t& oa, int64_t& ob) {
  oa = ob = 0;
  for (size_t i = n.dims.size() - 1; i-- > 0;) {
    int64_t idx = r % n.dims[i];
    r /= n.dims[i];
    oa += idx * n.sa[i];
    ob += idx * n.sb[i];
  }
}

template <class T> inline T apply(BinOp op, T x, T y) {
  return op == BinOp::Add ? x + y : op == BinOp::Sub ? x - y : x * y;
}

// One inner row of length k with unit or zero strides.
template <class T, class Store>
void innerRow(BinOp op, const T* a, int64_t sa, const T* b, int64_t sb, int64_t k, Store st) {
  if (sa && sb)
    for (int64_t j = 0; j < k; ++j)
      st(j, apply(op, a[j], b[j]));
  else if (sa)
    for (int64_t j = 0; j < k; ++j)
      st(j, apply(op, a[j], b[0]));
  else if (sb)
    for (int64_t j = 0; j < k; ++j)
      st(j, apply(op, a[0], b[j]));
  else
    for (int64_t j = 0; j < k; ++j)
      st(j, apply(op, a[0], b[0]));
}

// y (+)= a op b over the output shape. `acc` adds into y (gradients).
template <class T>
void broadcastBinary(BinOp op, const T* a, const std::vector<int64_t>& as, const T* b,
                     const std::vector<int64_t>& bs, T* y, const std::vector<int64_t>& ys,
                     bool acc) {
  Nest n = broadcastNest(ys, as, bs);
  int64_t k = n.dims.back(), rows = 1;
  for (size_t i = 0; i + 1 < n.dims.size(); ++i)
    rows *= n.dims[i];
  int64_t sa = n.sa.back(), sb = n.sb.back();
  if (rows == 1) { // one long row: split it into pieces instead
    parallelFor(k, kParallelMin, [&](int64_t lo, int64_t hi) {
      T* yr = y + lo;
      auto st = [&](int64_t j, T v) { yr[j] = acc ? yr[j] + v : v; };
      innerRow(op, a + lo * sa, sa, b + lo * sb, sb, hi - lo, st);
    });
    return;
  }
  parallelFor(rows, rowGrain(k), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t oa, ob;
      rowOffsets(n, r, oa, ob);
      T* yr = y + r * k;
      auto st = [&](int64_t j, T v) { yr[j] = acc ? yr[j] + v : v; };
      innerRow(op, a + oa, sa, b + ob, sb, k, st);
    }
  });
}

// y = a op b like broadcastBinary, where a, b and y may each be f32 or half precision:
// each inner row (or piece of one long row) converted on its thread.
void broadcastStored(BinOp op, const TensorView& a, const TensorView& b, const TensorView& y) {
  Nest n = broadcastNest(y.shape, a.shape, b.shape);
  int64_t k = n.dims.back(), rows = 1;
  for (size_t i = 0; i + 1 < n.dims.size(); ++i)
    rows *= n.dims[i];
  int64_t sa = n.sa.back(), sb = n.sb.back();
  // Elements [j0, j1) of the inner row whose operands start at oa and ob, y's at oy, in
  // runs that stay in the core's cache.
  auto run = [&](int64_t oa, int64_t ob, int64_t oy, int64_t j0, int64_t j1) {
    float* t = scratch(11, 3 * kRun);
    for (int64_t i = j0; i < j1; i += kRun) {
      int64_t len = std::min(kRun, j1 - i);
      const float* pa = f32Run(a, oa + i * sa, sa ? len : 1, t);
      const float* pb = f32Run(b, ob + i * sb, sb ? len : 1, t + kRun);
      GradOut out = outRun(y, false, oy + i, len, t + 2 * kRun);
      innerRow(op, pa, sa, pb, sb, len, [&](int64_t j, float v) { out.p[j] = v; });
      storeRun(y, oy + i, len, out);
    }
  };
  if (rows == 1)
    return parallelFor(k, kParallelMin, [&](int64_t lo, int64_t hi) { run(0, 0, 0, lo, hi); });
  parallelFor(rows, rowGrain(k), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t oa, ob;
      rowOffsets(n, r, oa, ob);
      run(oa, ob, r * k, 0, k);
    }
  });
}

// dst (+)= alpha * (src summed over the dims where dst broadcasts to src's shape).
void reduceTo(const float* src, const std::vector<int64_t>& srcShape, const GradOut& dst,
              const std::vector<int64_t>& dstShape, float alpha) {
  // Collapse (src, dst) as a nest: dst strides are 0 on reduced dims.
  Nest n = broadcastNest(srcShape, dstShape, srcShape);
  size_t r = n.dims.size();
  if (r == 2 && n.sa[0] == 0 && n.sa[1] == 1) { // [R, K] -> [K]: column sums
    float* tmp = scratch(6, n.dims[1]);
    columnSum(src, n.dims[0], n.dims[1], GradOut{tmp, false});
    for (int64_t j = 0; j < n.dims[1]; ++j)
      dst.put(j, alpha * tmp[j]);
    return;
  }
  int64_t total = 1, outN = 1;
  for (size_t i = 0; i < r; ++i) {
    total *= n.dims[i];
    if (n.sa[i]) outN *= n.dims[i];
  }
  // General: each dst element sums its src elements in lexicographic order.
  std::vector<int64_t> keep, red, keepStride, redStride;
  for (size_t i = 0; i < r; ++i) {
    (n.sa[i] ? keep : red).push_back(n.dims[i]);
    (n.sa[i] ? keepStride : redStride).push_back(n.sb[i]);
  }
  int64_t redN = total / std::max<int64_t>(outN, 1);
  parallelFor(outN, rowGrain(redN), [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      int64_t base = 0, rem = j;
      for (size_t i = keep.size(); i-- > 0;) {
        base += (rem % keep[i]) * keepStride[i];
        rem /= keep[i];
      }
      float s = 0;
      for (int64_t q = 0; q < redN; ++q) {
        int64_t off = base, rq = q;
        for (size_t i = red.size(); i-- > 0;) {
          off += (rq % red[i]) * redStride[i];
          rq /= red[i];
        }
        s += src[off];
      }
      dst.put(j, alpha * s);
    }
  });
}

// Backward of a op b for one operand x (index i: 0 = a, 1 = b), with `other` the other operand.
// in = [dy, a, b, y], out = [da, db].
void binaryGrad(const KernelCall& c, BinOp op, int i) {
  GradOut dx = gradOut(c, i);
  if (!dx) return;
  const TensorView &dy = c.in[0], &x = c.in[1 + i], &other = c.in[2 - i];
  int64_t n = dy.numel();
  const float* src = dy.f32();
  float alpha = (op == BinOp::Sub && i == 1) ? -1.f : 1.f;
  if (op == BinOp::Mul) { // src = dy * other over the output shape
    float* tmp = sameShape(x.shape, dy.shape) ? nullptr : scratch(5, n);
    if (!tmp) {
      broadcastBinary(BinOp::Mul, src, dy.shape, other.f32(), other.shape, dx.p, dy.shape, dx.acc);
      return;
    }
    broadcastBinary(BinOp::Mul, src, dy.shape, other.f32(), other.shape, tmp, dy.shape, false);
    src = tmp;
  }
  if (sameShape(x.shape, dy.shape) && alpha == 1.f) return writeOrAdd(dx, src, n);
  reduceTo(src, dy.shape, dx, x.shape, alpha);
}

// add's gradient for operand i (in = [dy, a, b, y], out = [da, db]) where dy or the
// gradient is half precision (amp): dy as it is, or summed over the dims the operand
// broadcasts along (dy widened whole, into the sums' f32 copy: a broadcast operand is
// small and rare, `positions`).
void addGradStored(const KernelCall& c, int i) {
  const TensorView &dy = c.in[0], &x = c.in[1 + i], &dx = c.out[i];
  if (!dx.data) return;
  bool acc = accumulates(c, i);
  int64_t n = dy.numel();
  if (sameShape(x.shape, dy.shape))
    return parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
      float* t = scratch(11, 2 * kRun);
      for (int64_t at = lo; at < hi; at += kRun) {
        int64_t len = std::min(kRun, hi - at);
        const float* g = f32Run(dy, at, len, t);
        GradOut out = outRun(dx, acc, at, len, t + kRun);
        for (int64_t j = 0; j < len; ++j)
          out.put(j, g[j]);
        storeRun(dx, at, len, out);
      }
    });
  int64_t m = x.numel();
  GradOut sums = outRun(dx, acc, 0, m, scratch(3, m));
  reduceTo(f32Run(dy, 0, n, scratch(5, n)), dy.shape, sums, x.shape, 1.f);
  storeRun(dx, 0, m, sums);
}

bool anyHalf(const std::vector<TensorView>& views) {
  return std::any_of(views.begin(), views.end(),
                     [](const TensorView& v) { return v.data && ir::isHalf(v.dtype); });
}

void binary(const KernelCall& c, BinOp op) {
  bool half = anyHalf(c.in) || anyHalf(c.out);
  EPL_ASSERT(!half || op == BinOp::Add, "of the elementwise ops, add takes half precision");
  if (!c.backward) {
    const TensorView &a = c.in[0], &b = c.in[1], &y = c.out[0];
    if (y.dtype == ir::DType::I32)
      return broadcastBinary(op, a.i32(), a.shape, b.i32(), b.shape, y.i32(), y.shape, false);
    if (half) return broadcastStored(op, a, b, y);
    EPL_ASSERT(y.dtype == ir::DType::F32, "elementwise ops take f32 or i32");
    return broadcastBinary(op, a.f32(), a.shape, b.f32(), b.shape, y.f32(), y.shape, false);
  }
  for (int i = 0; i < 2; ++i)
    half ? addGradStored(c, i) : binaryGrad(c, op, i);
}

// out[a, j, m, i, n] = in[a, i, m, j, n] for shape in = [A, I, M, J, N].
template <class T>
void transposeCopy(const T* in, T* out, int64_t a, int64_t ni, int64_t m, int64_t nj, int64_t n,
                   bool acc) {
  int64_t outer = a * nj * m * ni;
  parallelFor(outer, rowGrain(n), [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) { // o enumerates (a, j, m, i) of the output
      int64_t i = o % ni, rest = o / ni;
      int64_t mm = rest % m, rest2 = rest / m;
      int64_t j = rest2 % nj, aa = rest2 / nj;
      const T* src = in + (((aa * ni + i) * m + mm) * nj + j) * n;
      T* dst = out + o * n;
      for (int64_t e = 0; e < n; ++e)
        dst[e] = acc ? dst[e] + src[e] : src[e];
    }
  });
}

} // namespace

void add(const KernelCall& c) {
  binary(c, BinOp::Add);
}
void sub(const KernelCall& c) {
  binary(c, BinOp::Sub);
}
void mul(const KernelCall& c) {
  binary(c, BinOp::Mul);
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx].
void scale(const KernelCall& c) {
  float f = static_cast<float>(attrFloat(c, "factor"));
  int64_t n = c.in[0].numel();
  GradOut dst = c.backward ? gradOut(c, 0) : GradOut{c.out[0].f32(), false};
  if (!dst) return;
  const float* src = c.in[0].f32();
  parallelFor(n, kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i)
      dst.put(i, f * src[i]);
  });
}

// Flatten and reshape keep the elements in order: the output is a copy of the input.
void reshape(const KernelCall& c) {
  if (!c.backward) {
    if (c.out[0].data != c.in[0].data)
      std::memcpy(c.out[0].data, c.in[0].data, static_cast<size_t>(c.in[0].bytes()));
    return;
  }
  if (GradOut dx = gradOut(c, 0)) writeOrAdd(dx, c.in[0].f32(), c.in[0].numel());
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx] (dy transposed back).
void transpose(const KernelCall& c) {
  const TensorView& src = c.in[0]; // x forward, dy (already in the output's shape) backward
  TransposeDims t = transposeDims(c, src);
  if (!c.backward && src.dtype == ir::DType::I32) { // integer ids move as they are
    if (t.same) return (void)std::memcpy(c.out[0].data, src.data, src.bytes());
    return transposeCopy(src.i32(), c.out[0].i32(), t.a, t.i, t.m, t.j, t.n, false);
  }
  GradOut dst = c.backward ? gradOut(c, 0) : GradOut{c.out[0].f32(), false};
  if (!dst) return;
  EPL_ASSERT(src.dtype == ir::DType::F32, "transpose takes f32 or i32");
  if (t.same) return writeOrAdd(dst, src.f32(), src.numel());
  transposeCopy(src.f32(), dst.p, t.a, t.i, t.m, t.j, t.n, dst.acc);
}

} // namespace epl::backend::cpu
