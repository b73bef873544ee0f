// Elementwise ops on the GPU, ported from backend/cpu/Elementwise.cpp: add, sub, mul with
// NumPy broadcasting (either operand may broadcast), scale, flatten/reshape (a copy) and
// transpose of two dims. Broadcasting is a loop nest built on the host (the CPU's merged dims
// and per-operand strides) and passed to the kernel by value. The gradient of an operand that
// broadcasts sums chunks of fixed size in order, then the chunks in order: deterministic.
// Under amp, add reads and writes its half-precision tensors as they are stored (Common.cuh's
// Stored), as on the CPU.
//
// Shape legend: A, I, M, J, N the dims of a transpose ([A, I, M, J, N] -> [A, J, M, I, N]);
// for a reduction, `keep` dims survive in the operand and `red` dims are summed away.
#include "backend/KernelShapes.h"
#include "backend/cuda/Common.cuh"
#include "support/Assert.h"

#include <stdexcept>
#include <vector>

namespace epl::backend::cuda {

namespace {

enum class BinOp { Add, Sub, Mul };

constexpr int kMaxDims = 8;     // loop-nest dims after merging
constexpr int64_t kChunk = 256; // reduced elements one thread sums before the chunks are added
// out = a op b as a loop nest: output dims and each operand's element strides (0 where it
// broadcasts), adjacent dims merged where both operands allow (the CPU's makeNest).
struct Nest {
  int rank = 0;
  int64_t dims[kMaxDims], sa[kMaxDims], sb[kMaxDims];
};

// The shared loop nest (KernelShapes.h) in a fixed-size form a kernel takes by value.
Nest makeNest(const std::vector<int64_t>& out, const std::vector<int64_t>& a,
              const std::vector<int64_t>& b) {
  BroadcastNest shared = broadcastNest(out, a, b);
  if (shared.dims.size() > kMaxDims)
    throw std::runtime_error("elementwise op: more than 8 dims after merging on the GPU");
  Nest n;
  n.rank = static_cast<int>(shared.dims.size());
  for (int i = 0; i < n.rank; ++i) {
    n.dims[i] = shared.dims[i];
    n.sa[i] = shared.sa[i];
    n.sb[i] = shared.sb[i];
  }
  return n;
}

int64_t numelOf(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape)
    p *= d;
  return p;
}

template <class T> __device__ inline T apply(BinOp op, T x, T y) {
  return op == BinOp::Add ? x + y : op == BinOp::Sub ? x - y : x * y;
}

// The elements of a and b that output element i combines.
__device__ inline void operandOffsets(const Nest& n, int64_t i, int64_t& oa, int64_t& ob) {
  int64_t rest = i;
  oa = ob = 0;
  for (int d = n.rank - 1; d > 0; --d) {
    int64_t idx = rest % n.dims[d];
    rest /= n.dims[d];
    oa += idx * n.sa[d];
    ob += idx * n.sb[d];
  }
  oa += rest * n.sa[0];
  ob += rest * n.sb[0];
}

// y[i] (+)= a op b at output element i; `acc` only for float gradients.
template <class T>
__global__ void binaryKernel(BinOp op, Nest n, const T* a, const T* b, T* y, bool acc,
                             int64_t total) {
  EPL_GRID_STRIDE(i, total) {
    int64_t oa, ob;
    operandOffsets(n, i, oa, ob);
    T v = apply(op, a[oa], b[ob]);
    y[i] = acc ? y[i] + v : v;
  }
}

// y = a op b at output element i, each tensor as stored (amp: f32 or half precision).
__global__ void storedBinaryKernel(BinOp op, Nest n, Stored a, Stored b, Stored y, int64_t total) {
  EPL_GRID_STRIDE(i, total) {
    int64_t oa, ob;
    operandOffsets(n, i, oa, ob);
    y.set(i, apply(op, a[oa], b[ob]));
  }
}

// dst (+)= src elementwise, each as stored.
__global__ void storedCopyKernel(Stored src, StoredGrad dst, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    dst.put(i, src[i]);
  }
}

// y (+)= a op b over y's shape.
template <class T>
void broadcastBinary(const Ctx& ctx, BinOp op, const T* a, const std::vector<int64_t>& as,
                     const T* b, const std::vector<int64_t>& bs, T* y,
                     const std::vector<int64_t>& ys, bool acc) {
  int64_t total = numelOf(ys);
  binaryKernel<T><<<blocksFor(total), kThreads, 0, ctx.stream>>>(op, makeNest(ys, as, bs), a, b, y,
                                                                 acc, total);
  checkLaunch("elementwise op");
}

// dst (+)= alpha * (src summed over the dims where dst broadcasts to src's shape). dst element
// j sums its `redN` source elements in chunks of kChunk, each in order, then the chunks in order.
struct Reduction {
  int nKeep = 0, nRed = 0;
  int64_t keep[kMaxDims], keepStride[kMaxDims], red[kMaxDims], redStride[kMaxDims];
  int64_t outN = 1, redN = 1;
  __host__ __device__ int64_t chunks() const {
    return std::max<int64_t>(1, (redN + kChunk - 1) / kChunk);
  }
  // Partial sums in scratch, when there is more than one chunk.
  int64_t scratchBytes() const {
    return chunks() > 1 ? alignUp(static_cast<int64_t>(sizeof(float)) * chunks() * outN) : 0;
  }
};

Reduction makeReduction(const std::vector<int64_t>& srcShape,
                        const std::vector<int64_t>& dstShape) {
  // The nest of (dst, src) over src's shape: dst strides are 0 on reduced dims, and merged
  // dims are all kept or all reduced.
  Nest n = makeNest(srcShape, dstShape, srcShape);
  Reduction r;
  for (int i = 0; i < n.rank; ++i) {
    if (n.sa[i]) {
      r.keep[r.nKeep] = n.dims[i];
      r.keepStride[r.nKeep++] = n.sb[i];
      r.outN *= n.dims[i];
    } else {
      r.red[r.nRed] = n.dims[i];
      r.redStride[r.nRed++] = n.sb[i];
      r.redN *= n.dims[i];
    }
  }
  return r;
}

// The offset of element i of a row-major index space of `rank` dims with the given strides.
__device__ inline int64_t offsetOf(int64_t i, const int64_t* dims, const int64_t* strides,
                                   int rank) {
  if (rank == 0) return 0;
  int64_t off = 0;
  for (int d = rank - 1; d > 0; --d) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off + i * strides[0];
}

// out[c, j] (+)= alpha * (sum of chunk c of dst element j's sources), out laid out [chunks, outN].
// Src: f32 (`const float*`) or Stored; Out: GradOut or StoredGrad.
template <class Src, class Out>
__global__ void reduceChunksKernel(Src src, Reduction r, float alpha, Out out) {
  int64_t chunks = r.chunks();
  EPL_GRID_STRIDE(t, chunks * r.outN) {
    int64_t j = t % r.outN, ch = t / r.outN;
    int64_t base = offsetOf(j, r.keep, r.keepStride, r.nKeep);
    int64_t q1 = std::min(r.redN, (ch + 1) * kChunk);
    float s = 0;
    for (int64_t q = ch * kChunk; q < q1; ++q)
      s += src[base + offsetOf(q, r.red, r.redStride, r.nRed)];
    out.put(t, alpha * s);
  }
}

// dst[j] (+)= alpha * sum over chunks of part[c, j], in chunk order.
template <class Out>
__global__ void sumChunksKernel(const float* part, int64_t chunks, int64_t outN, float alpha,
                                Out dst) {
  EPL_GRID_STRIDE(j, outN) {
    float s = 0;
    for (int64_t ch = 0; ch < chunks; ++ch)
      s += part[ch * outN + j];
    dst.put(j, alpha * s);
  }
}

// `scratch` holds r.scratchBytes().
template <class Src, class Out>
void reduceTo(const Ctx& ctx, Src src, const Reduction& r, const Out& dst, float alpha,
              void* scratch) {
  int64_t chunks = r.chunks();
  if (chunks <= 1) {
    reduceChunksKernel<<<blocksFor(r.outN), kThreads, 0, ctx.stream>>>(src, r, alpha, dst);
    checkLaunch("broadcast gradient");
    return;
  }
  float* part = static_cast<float*>(scratch);
  reduceChunksKernel<<<blocksFor(chunks * r.outN), kThreads, 0, ctx.stream>>>(src, r, 1.f,
                                                                              GradOut{part, false});
  checkLaunch("broadcast gradient");
  sumChunksKernel<<<blocksFor(r.outN), kThreads, 0, ctx.stream>>>(part, chunks, r.outN, alpha, dst);
  checkLaunch("broadcast gradient");
}

// The gradient of operand i (0 = a, 1 = b) of a op b: dy, times the other operand for mul,
// summed over the dims where the operand broadcasts (negated for b of sub).
// in = [dy, a, b, y], out = [da, db].
struct OperandGrad {
  GradOut dx;
  float alpha = 1.f;
  bool product = false; // mul: src = dy * other over dy's shape
  bool reduce = false;  // summed over broadcast dims (or negated); else a copy
  Reduction r;
  int64_t n = 0; // elements of dy
  // Scratch: the product when it is reduced afterwards, then the reduction's partial sums.
  int64_t productBytes() const {
    return product && reduce ? alignUp(static_cast<int64_t>(sizeof(float)) * n) : 0;
  }
  int64_t scratchBytes() const { return productBytes() + (reduce ? r.scratchBytes() : 0); }
};

OperandGrad planGrad(const KernelCall& c, BinOp op, int i) {
  OperandGrad g;
  g.dx = gradOut(c, static_cast<size_t>(i));
  if (!g.dx) return g;
  const TensorView &dy = c.in[0], &x = c.in[1 + i];
  g.n = dy.numel();
  g.alpha = (op == BinOp::Sub && i == 1) ? -1.f : 1.f;
  g.product = op == BinOp::Mul;
  g.reduce = !sameShape(x.shape, dy.shape) || g.alpha != 1.f;
  if (g.reduce) g.r = makeReduction(dy.shape, x.shape);
  return g;
}

void runGrad(const KernelCall& c, const Ctx& ctx, const OperandGrad& g, int i, char* scratch) {
  if (!g.dx) return;
  const TensorView &dy = c.in[0], &other = c.in[2 - i];
  const float* src = dy.f32();
  if (g.product && !g.reduce)
    return broadcastBinary(ctx, BinOp::Mul, src, dy.shape, other.f32(), other.shape, g.dx.p,
                           dy.shape, g.dx.acc);
  if (g.product) {
    float* tmp = reinterpret_cast<float*>(scratch);
    broadcastBinary(ctx, BinOp::Mul, src, dy.shape, other.f32(), other.shape, tmp, dy.shape, false);
    src = tmp;
  }
  if (!g.reduce) return writeOrAdd(ctx, g.dx, src, g.n);
  reduceTo(ctx, src, g.r, g.dx, g.alpha, scratch + g.productBytes());
}

// The two operands' gradients run one after the other on the stream, so they share scratch.
void binaryBackward(const KernelCall& c, const Ctx& ctx, BinOp op) {
  OperandGrad grads[2] = {planGrad(c, op, 0), planGrad(c, op, 1)};
  int64_t bytes = std::max(grads[0].scratchBytes(), grads[1].scratchBytes());
  char* scratch = bytes > 0 ? static_cast<char*>(ctx.scratch->get(bytes)) : nullptr;
  runGrad(c, ctx, grads[0], 0, scratch);
  runGrad(c, ctx, grads[1], 1, scratch);
}

// add's backward where dy or a gradient is half precision (amp): each operand's gradient
// from dy as stored, a copy or summed over the dims it broadcasts along.
void addBackwardStored(const KernelCall& c, const Ctx& ctx) {
  const TensorView& dy = c.in[0];
  for (int i = 0; i < 2; ++i) {
    StoredGrad dx = storedGrad(c, static_cast<size_t>(i));
    if (!dx) continue;
    const TensorView& x = c.in[1 + i];
    if (sameShape(x.shape, dy.shape)) {
      storedCopyKernel<<<blocksFor(dy.numel()), kThreads, 0, ctx.stream>>>(storedOf(dy), dx,
                                                                           dy.numel());
      checkLaunch("add backward");
      continue;
    }
    Reduction r = makeReduction(dy.shape, x.shape);
    int64_t bytes = r.scratchBytes();
    reduceTo(ctx, storedOf(dy), r, dx, 1.f, bytes > 0 ? ctx.scratch->get(bytes) : nullptr);
  }
}

bool anyHalf(const std::vector<TensorView>& views) {
  for (const TensorView& v : views)
    if (v.data && ir::isHalf(v.dtype)) return true;
  return false;
}

void binary(const KernelCall& c, const Ctx& ctx, BinOp op) {
  bool half = anyHalf(c.in) || anyHalf(c.out);
  EPL_ASSERT(!half || op == BinOp::Add, "of the elementwise ops, add takes half precision");
  if (c.backward) return half ? addBackwardStored(c, ctx) : binaryBackward(c, ctx, op);
  const TensorView &a = c.in[0], &b = c.in[1], &y = c.out[0];
  if (y.dtype == ir::DType::I32)
    return broadcastBinary(ctx, op, a.i32(), a.shape, b.i32(), b.shape, y.i32(), y.shape, false);
  if (half) {
    int64_t total = y.numel();
    storedBinaryKernel<<<blocksFor(total), kThreads, 0, ctx.stream>>>(
        op, makeNest(y.shape, a.shape, b.shape), storedOf(a), storedOf(b), storedOf(y), total);
    return checkLaunch("add");
  }
  EPL_ASSERT(y.dtype == ir::DType::F32, "elementwise ops take f32 or i32");
  broadcastBinary(ctx, op, a.f32(), a.shape, b.f32(), b.shape, y.f32(), y.shape, false);
}

__global__ void scaleKernel(float f, const float* src, GradOut dst, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    dst.put(i, f * src[i]);
  }
}

__global__ void addIntoKernel(float* dst, const float* src, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    dst[i] += src[i];
  }
}

// out[a, j, m, i, n] (+)= in[a, i, m, j, n]; `acc` only for float gradients.
template <class T>
__global__ void transposeKernel(const T* in, T* out, TransposeDims s, bool acc, int64_t total) {
  EPL_GRID_STRIDE(t, total) {
    int64_t e = t % s.n, o = t / s.n; // o enumerates (a, j, m, i) of the output
    int64_t i = o % s.i, rest = o / s.i;
    int64_t mm = rest % s.m, rest2 = rest / s.m;
    int64_t j = rest2 % s.j, aa = rest2 / s.j;
    T v = in[(((aa * s.i + i) * s.m + mm) * s.j + j) * s.n + e];
    out[t] = acc ? out[t] + v : v;
  }
}

template <class T>
void transposeCopy(const Ctx& ctx, const T* in, T* out, const TransposeDims& s, bool acc) {
  int64_t total = s.a * s.i * s.m * s.j * s.n;
  transposeKernel<T><<<blocksFor(total), kThreads, 0, ctx.stream>>>(in, out, s, acc, total);
  checkLaunch("transpose");
}

void copyAsync(const Ctx& ctx, void* dst, const void* src, int64_t bytes, const char* what) {
  if (bytes > 0 && dst != src)
    check(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, ctx.stream),
        what);
}

} // namespace

void add(const KernelCall& c, const Ctx& ctx) {
  binary(c, ctx, BinOp::Add);
}

void sub(const KernelCall& c, const Ctx& ctx) {
  binary(c, ctx, BinOp::Sub);
}

void mul(const KernelCall& c, const Ctx& ctx) {
  binary(c, ctx, BinOp::Mul);
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx].
void scale(const KernelCall& c, const Ctx& ctx) {
  float f = static_cast<float>(attrFloat(c, "factor"));
  int64_t n = c.in[0].numel();
  GradOut dst = c.backward ? gradOut(c, 0) : GradOut{c.out[0].f32(), false};
  if (!dst) return;
  scaleKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(f, c.in[0].f32(), dst, n);
  checkLaunch("scale");
}

// Flatten and reshape keep the elements in order: the output is a copy of the input.
void reshape(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return copyAsync(ctx, c.out[0].data, c.in[0].data, c.in[0].bytes(), "reshape");
  if (GradOut dx = gradOut(c, 0)) writeOrAdd(ctx, dx, c.in[0].f32(), c.in[0].numel());
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx] (dy transposed back).
void transpose(const KernelCall& c, const Ctx& ctx) {
  const TensorView& src = c.in[0]; // x forward, dy (already in the output's shape) backward
  TransposeDims dims = transposeDims(c, src);
  if (!c.backward && src.dtype == ir::DType::I32) { // integer ids move as they are
    if (dims.same) return copyAsync(ctx, c.out[0].data, src.data, src.bytes(), "transpose");
    return transposeCopy(ctx, src.i32(), c.out[0].i32(), dims, false);
  }
  GradOut dst = c.backward ? gradOut(c, 0) : GradOut{c.out[0].f32(), false};
  if (!dst) return;
  EPL_ASSERT(src.dtype == ir::DType::F32, "transpose takes f32 or i32");
  if (dims.same) return writeOrAdd(ctx, dst, src.f32(), src.numel());
  transposeCopy(ctx, src.f32(), dst.p, dims, dst.acc);
}

void writeOrAdd(const Ctx& ctx, const GradOut& dst, const float* src, int64_t n) {
  if (!dst.acc)
    return copyAsync(ctx, dst.p, src, static_cast<int64_t>(sizeof(float)) * n, "writeOrAdd");
  addIntoKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(dst.p, src, n);
  checkLaunch("writeOrAdd");
}

} // namespace epl::backend::cuda
