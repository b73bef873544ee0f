// Activations on the GPU: gelu (tanh approximation, or exact with erf), relu, silu, tanh, sigmoid,
// softmax over the last dim, and seeded dropout, ported from backend/cpu/Activations.cpp.
// Elementwise ops are one grid-stride kernel over a functor; softmax runs one block per row with a
// fixed-order tree reduction, so its sums are the same on every run.
//
// Shape legend: n elements; N rows and C columns for softmax.
#include "backend/DropoutMask.h"
#include "backend/cuda/Common.cuh"
#include "support/Assert.h"

#include <cmath>

namespace epl::backend::cuda {

namespace {

constexpr float kGeluC = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr float kRsqrt2 = 0.7071067811865476f;   // 1 / sqrt(2)
constexpr float kRsqrt2Pi = 0.3989422804014327f; // 1 / sqrt(2 pi)

// dst[i] (+)= v: GradOut::put on the device.
__device__ inline float sigmoidOf(float x) {
  return 1.f / (1.f + expf(-x));
}

__device__ inline float geluTanh(float x) {
  return tanhf(kGeluC * (x + kGeluA * x * x * x));
}

// Forward functors: y = f(x).
struct GeluF {
  __device__ float operator()(float x) const { return 0.5f * x * (1.f + geluTanh(x)); }
};
struct GeluExactF { // x Phi(x)
  __device__ float operator()(float x) const { return 0.5f * x * (1.f + erff(x * kRsqrt2)); }
};
struct ReluF {
  __device__ float operator()(float x) const { return x < 0.f ? 0.f : x; } // std::max(x, 0)
};
struct SiluF {
  __device__ float operator()(float x) const { return x * sigmoidOf(x); }
};
struct TanhF {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct SigmoidF {
  __device__ float operator()(float x) const { return sigmoidOf(x); }
};

// Backward functors: dx = g(dy, v), where v is x or y, whichever the rule reads.
struct GeluGrad { // reads x
  __device__ float operator()(float dy, float x) const {
    float t = geluTanh(x);
    return dy *
           (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * x * x));
  }
};
struct GeluExactGrad { // reads x
  __device__ float operator()(float dy, float x) const {
    return dy * (0.5f * (1.f + erff(x * kRsqrt2)) + x * kRsqrt2Pi * expf(-0.5f * x * x));
  }
};
struct ReluGradX { // reads x (mlp and moe)
  __device__ float operator()(float dy, float x) const { return x > 0.f ? dy : 0.f; }
};
struct ReluGradY { // reads y (the relu op)
  __device__ float operator()(float dy, float y) const { return dy * (y > 0.f ? 1.f : 0.f); }
};
struct SiluGrad { // reads x
  __device__ float operator()(float dy, float x) const {
    float s = sigmoidOf(x);
    return dy * (s * (1.f + x * (1.f - s)));
  }
};
struct TanhGrad { // reads y
  __device__ float operator()(float dy, float y) const { return dy * (1.f - y * y); }
};
struct SigmoidGrad { // reads y
  __device__ float operator()(float dy, float y) const { return dy * (y * (1.f - y)); }
};

template <class F> __global__ void mapKernel(F f, const float* x, float* y, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    y[i] = f(x[i]);
  }
}

template <class G>
__global__ void gradKernel(G g, const float* dy, const float* v, GradOut dx, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    dx.put(i, g(dy[i], v[i]));
  }
}

template <class F>
void launchMap(const Ctx& ctx, F f, const float* x, float* y, int64_t n, const char* what) {
  mapKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(f, x, y, n);
  checkLaunch(what);
}

template <class G>
void launchGrad(const Ctx& ctx, G g, const float* dy, const float* v, const GradOut& dx, int64_t n,
                const char* what) {
  gradKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(g, dy, v, dx, n);
  checkLaunch(what);
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y], out = [dx]; v is c.in[vIndex].
template <class F, class G>
void pointwise(const KernelCall& c, const Ctx& ctx, F f, G g, size_t vIndex, const char* what) {
  int64_t n = c.in[0].numel();
  if (!c.backward) return launchMap(ctx, f, c.in[0].f32(), c.out[0].f32(), n, what);
  if (GradOut dx = gradOut(c, 0))
    launchGrad(ctx, g, c.in[0].f32(), c.in[vIndex].f32(), dx, n, what);
}

// Row reductions: blockDim.x is a multiple of 32; the butterfly and the tree below add in an
// order fixed by the block size, and every thread gets the same result.
template <class T, class Op> __device__ T warpReduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <class T, class Op> __device__ T blockReduce(T v, Op op, T identity) {
  __shared__ T part[32];
  v = warpReduce(v, op);
  unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads(); // a previous call may still be reading `part`
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? part[lane] : identity;
  return warpReduce(v, op);
}

// One block per row: a warp for short rows, up to 512 threads for long ones.
unsigned rowThreads(int64_t cols) {
  return static_cast<unsigned>(std::clamp<int64_t>((cols + 31) / 32 * 32, 32, 512));
}
unsigned rowBlocks(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{65535} * 16));
}

// y = exp(x - max) / sum, the sum in double as on the CPU. x and y may be the same rows: each
// thread reads x[j] before it writes y[j], and the max is complete before any write.
__global__ void softmaxKernel(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      m = fmaxf(m, xr[j]);
    m = blockReduce(m, Max{}, -INFINITY);
    double s = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float e = expf(xr[j] - m);
      yr[j] = e;
      s += e;
    }
    s = blockReduce(s, Sum{}, 0.0);
    float inv = static_cast<float>(1.0 / s);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      yr[j] *= inv;
  }
}

// dx (+)= y (dy - sum_j dy y), per row.
__global__ void softmaxGradKernel(const float* dy, const float* y, GradOut dx, int64_t rows,
                                  int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *gr = dy + r * cols, *yr = y + r * cols;
    double dot = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dot += gr[j] * yr[j];
    float d = static_cast<float>(blockReduce(dot, Sum{}, 0.0));
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx.put(r * cols + j, yr[j] * (gr[j] - d));
  }
}

__global__ void dropoutKernel(DropoutMask mask, int64_t at, CutPiece cut, const float* src,
                              GradOut dst, int64_t n) {
  EPL_GRID_STRIDE(i, n) {
    dst.put(i, src[i] * mask.factor(at + cut.whole(i)));
  }
}

// dst (+)= src * mask(elementOffset + i), i the element's index in the whole tensor where the
// call holds a piece of it cut over a split group; the identity when not training or p == 0.
// The mask is built on the host and hashes the same elements as the CPU's.
void dropoutApply(const KernelCall& c, const Ctx& ctx, const float* src, const GradOut& dst,
                  int64_t n) {
  double p = attrFloat(c, "p");
  if (!c.training || p == 0) return writeOrAdd(ctx, dst, src, n);
  dropoutKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(DropoutMask(c.seed, p), c.elementOffset,
                                                           c.cutOf(), src, dst, n);
  checkLaunch("dropout");
}

} // namespace

void actForward(const Ctx& ctx, Act a, const float* x, float* y, int64_t n) {
  switch (a) {
  case Act::Gelu:
    return launchMap(ctx, GeluF{}, x, y, n, "gelu");
  case Act::GeluExact:
    return launchMap(ctx, GeluExactF{}, x, y, n, "gelu");
  case Act::Relu:
    return launchMap(ctx, ReluF{}, x, y, n, "relu");
  case Act::Silu:
    return launchMap(ctx, SiluF{}, x, y, n, "silu");
  }
}

void actBackwardInPlace(const Ctx& ctx, Act a, const float* x, float* g, int64_t n) {
  GradOut dx{g, false};
  switch (a) {
  case Act::Gelu:
    return launchGrad(ctx, GeluGrad{}, g, x, dx, n, "gelu backward");
  case Act::GeluExact:
    return launchGrad(ctx, GeluExactGrad{}, g, x, dx, n, "gelu backward");
  case Act::Relu:
    return launchGrad(ctx, ReluGradX{}, g, x, dx, n, "relu backward");
  case Act::Silu:
    return launchGrad(ctx, SiluGrad{}, g, x, dx, n, "silu backward");
  }
}

void softmaxRows(const Ctx& ctx, const float* x, float* y, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  softmaxKernel<<<rowBlocks(rows), rowThreads(cols), 0, ctx.stream>>>(x, y, rows, cols);
  checkLaunch("softmax");
}

void gelu(const KernelCall& c, const Ctx& ctx) {
  if (geluForm(c) == Act::GeluExact)
    return pointwise(c, ctx, GeluExactF{}, GeluExactGrad{}, 1, "gelu");
  pointwise(c, ctx, GeluF{}, GeluGrad{}, 1, "gelu");
}

void relu(const KernelCall& c, const Ctx& ctx) {
  pointwise(c, ctx, ReluF{}, ReluGradY{}, 2, "relu");
}

void silu(const KernelCall& c, const Ctx& ctx) {
  pointwise(c, ctx, SiluF{}, SiluGrad{}, 1, "silu");
}

void tanh(const KernelCall& c, const Ctx& ctx) {
  pointwise(c, ctx, TanhF{}, TanhGrad{}, 2, "tanh");
}

void sigmoid(const KernelCall& c, const Ctx& ctx) {
  pointwise(c, ctx, SigmoidF{}, SigmoidGrad{}, 2, "sigmoid");
}

// Forward: in = [x [N, C]], out = [y]. Backward: in = [dy, x, y], out = [dx]; it reads y.
void softmax(const KernelCall& c, const Ctx& ctx) {
  int64_t cols = lastDim(c.in[0]), rows = rowsOf(c.in[0]);
  if (!c.backward) return softmaxRows(ctx, c.in[0].f32(), c.out[0].f32(), rows, cols);
  GradOut dx = gradOut(c, 0);
  if (!dx || rows == 0) return;
  softmaxGradKernel<<<rowBlocks(rows), rowThreads(cols), 0, ctx.stream>>>(
      c.in[0].f32(), c.in[2].f32(), dx, rows, cols);
  checkLaunch("softmax backward");
}

// Forward: in = [x], out = [y]. Backward: in = [dy, x, y] (neither read), out = [dx].
void dropout(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward)
    return dropoutApply(c, ctx, c.in[0].f32(), GradOut{c.out[0].f32(), false}, c.in[0].numel());
  if (GradOut dx = gradOut(c, 0)) dropoutApply(c, ctx, c.in[0].f32(), dx, c.in[0].numel());
}

} // namespace epl::backend::cuda
