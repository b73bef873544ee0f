// layer_norm and rms_norm over the last dim on the GPU, ported from backend/cpu/Norms.cpp,
// with the same saved tensors (mean and rstd per row). Rows run one block each with a
// fixed-order tree reduction; the weight and bias gradients sum blocks of kBlockRows rows
// into partials (one thread per block and column, rows in order), then add the partials in
// block order, so every sum is the same on every run. Under amp, layer_norm reads and writes
// its half-precision tensors as they are stored (Common.cuh's Stored), as on the CPU.
//
// Shape legend: N rows (every dim but the last), D width, P row blocks.
#include "backend/cuda/Common.cuh"

namespace epl::backend::cuda {

namespace {

constexpr int64_t kBlockRows = 32;

// The sum of v over the block, returned to every thread. blockDim.x is a multiple of 32; the
// butterfly and the tree add in an order fixed by the block size.
__device__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float blockSum(float v) {
  __shared__ float part[32];
  v = warpSum(v);
  unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads(); // a previous call may still be reading `part`
  if (lane == 0) part[warp] = v;
  __syncthreads();
  return warpSum(lane < blockDim.x / 32 ? part[lane] : 0.f);
}

// One block per row: a warp for short rows, up to 512 threads for long ones.
unsigned rowThreads(int64_t d) {
  return static_cast<unsigned>(std::clamp<int64_t>((d + 31) / 32 * 32, 32, 512));
}
unsigned rowBlocks(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{65535} * 16));
}

#define EPL_ROWS(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define EPL_COLS(j, d) for (int64_t j = threadIdx.x; j < (d); j += blockDim.x)

// y = (x - mean) rstd w + b, rstd = 1 / sqrt(var + eps); saves mean and rstd per row. The
// tensors as stored (f32, or half precision under amp).
__global__ void layerNormKernel(Stored x, const float* w, const float* b, float eps, int64_t rows,
                                int64_t d, Stored y, Stored mean, Stored rstd) {
  float fd = static_cast<float>(d);
  EPL_ROWS(r, rows) {
    int64_t row = r * d;
    float s = 0;
    EPL_COLS(j, d) s += x[row + j];
    float m = blockSum(s) / fd;
    float v = 0;
    EPL_COLS(j, d) v += (x[row + j] - m) * (x[row + j] - m);
    float rs = 1.f / sqrtf(blockSum(v) / fd + eps);
    if (threadIdx.x == 0) {
      mean.set(r, m);
      rstd.set(r, rs);
    }
    EPL_COLS(j, d) y.set(row + j, (x[row + j] - m) * rs * w[j] + b[j]);
  }
}

// xhat = (x - mean) rstd, g = dy w: dx (+)= rstd (g - mean(g) - xhat mean(g xhat)).
__global__ void layerNormGradKernel(Stored dy, Stored x, const float* w, Stored mean, Stored rstd,
                                    int64_t rows, int64_t d, StoredGrad dx) {
  float fd = static_cast<float>(d);
  EPL_ROWS(r, rows) {
    int64_t row = r * d;
    float m = mean[r], rs = rstd[r], sg = 0, sgx = 0;
    EPL_COLS(j, d) {
      float xh = (x[row + j] - m) * rs, g = dy[row + j] * w[j];
      sg += g;
      sgx += g * xh;
    }
    float mg = blockSum(sg) / fd, mgx = blockSum(sgx) / fd;
    EPL_COLS(j, d) {
      float xh = (x[row + j] - m) * rs;
      dx.put(row + j, rs * (dy[row + j] * w[j] - mg - xh * mgx));
    }
  }
}

// y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd per row.
__global__ void rmsNormKernel(const float* x, const float* w, float eps, int64_t rows, int64_t d,
                              float* y, float* rstd) {
  float fd = static_cast<float>(d);
  EPL_ROWS(r, rows) {
    const float* xr = x + r * d;
    float s = 0;
    EPL_COLS(j, d) s += xr[j] * xr[j];
    float rs = 1.f / sqrtf(blockSum(s) / fd + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    EPL_COLS(j, d) y[r * d + j] = xr[j] * rs * w[j];
  }
}

// xhat = x rstd, g = dy w: dx (+)= rstd (g - xhat mean(g xhat)).
__global__ void rmsNormGradKernel(const float* dy, const float* x, const float* w,
                                  const float* rstd, int64_t rows, int64_t d, GradOut dx) {
  float fd = static_cast<float>(d);
  EPL_ROWS(r, rows) {
    const float *xr = x + r * d, *gr = dy + r * d;
    float rs = rstd[r], sgx = 0;
    EPL_COLS(j, d) sgx += gr[j] * w[j] * (xr[j] * rs);
    float mgx = blockSum(sgx) / fd;
    EPL_COLS(j, d) dx.put(r * d + j, rs * (gr[j] * w[j] - xr[j] * rs * mgx));
  }
}

#undef EPL_ROWS
#undef EPL_COLS

// part[p, 0, j] = sum over the rows of block p of dy xhat, part[p, 1, j] = sum of dy;
// xhat = (x - mean) rstd, or x rstd for rms_norm (mean null).
__global__ void paramPartialsKernel(Stored dy, Stored x, Stored mean, Stored rstd, int64_t rows,
                                    int64_t d, float* part) {
  int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  EPL_GRID_STRIDE(t, blocks * d) {
    int64_t j = t % d, p = t / d, r1 = std::min(rows, (p + 1) * kBlockRows);
    float pw = 0, pb = 0;
    for (int64_t r = p * kBlockRows; r < r1; ++r) {
      float g = dy[r * d + j], xh = (x[r * d + j] - (mean.p ? mean[r] : 0.f)) * rstd[r];
      pw += g * xh;
      pb += g;
    }
    part[p * 2 * d + j] = pw;
    part[p * 2 * d + d + j] = pb;
  }
}

// out[j] (+)= sum over blocks of part[p, k, j], in block order.
__global__ void sumBlocksKernel(const float* part, int64_t blocks, int k, int64_t d, GradOut out) {
  EPL_GRID_STRIDE(j, d) {
    float s = 0;
    for (int64_t p = 0; p < blocks; ++p)
      s += part[(p * 2 + k) * d + j];
    out.put(j, s);
  }
}

// dw = sum over rows of dy xhat, db = sum over rows of dy (rms_norm: mean null, no db).
void paramGrads(const Ctx& ctx, Stored dy, Stored x, Stored mean, Stored rstd, int64_t rows,
                int64_t d, const GradOut& dw, const GradOut& db) {
  if (!dw && !db) return;
  int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  float* part = nullptr;
  if (blocks > 0) {
    part =
        static_cast<float*>(ctx.scratch->get(static_cast<int64_t>(sizeof(float)) * blocks * 2 * d));
    paramPartialsKernel<<<blocksFor(blocks * d), kThreads, 0, ctx.stream>>>(dy, x, mean, rstd, rows,
                                                                            d, part);
    checkLaunch("norm parameter gradients");
  }
  const GradOut outs[2] = {dw, db};
  for (int k = 0; k < 2; ++k) {
    if (!outs[k]) continue;
    sumBlocksKernel<<<blocksFor(d), kThreads, 0, ctx.stream>>>(part, blocks, k, d, outs[k]);
    checkLaunch("norm parameter gradients");
  }
}

// in = [x [N, D], w [D], b [D]], out = [y, mean [N], rstd [N]].
void layerNormForward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[0];
  int64_t d = lastDim(x), rows = rowsOf(x);
  if (rows == 0) return;
  float eps = static_cast<float>(attrFloat(c, "eps"));
  layerNormKernel<<<rowBlocks(rows), rowThreads(d), 0, ctx.stream>>>(
      storedOf(x), c.in[1].f32(), c.in[2].f32(), eps, rows, d, storedOf(c.out[0]),
      storedOf(c.out[1]), storedOf(c.out[2]));
  checkLaunch("layer_norm");
}

// in = [dy, x, w, b, y, mean, rstd], out = [dx, dw, db].
void layerNormBackward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), rows = rowsOf(x);
  Stored dy = storedOf(c.in[0]), mean = storedOf(c.in[5]), rstd = storedOf(c.in[6]);
  const float* w = c.in[2].f32();
  StoredGrad dx = storedGrad(c, 0);
  if (dx && rows > 0) {
    layerNormGradKernel<<<rowBlocks(rows), rowThreads(d), 0, ctx.stream>>>(dy, storedOf(x), w, mean,
                                                                           rstd, rows, d, dx);
    checkLaunch("layer_norm backward");
  }
  paramGrads(ctx, dy, storedOf(x), mean, rstd, rows, d, gradOut(c, 1), gradOut(c, 2));
}

// in = [x [N, D], w [D]], out = [y, rstd [N]].
void rmsNormForward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[0];
  int64_t d = lastDim(x), rows = rowsOf(x);
  if (rows == 0) return;
  float eps = static_cast<float>(attrFloat(c, "eps"));
  rmsNormKernel<<<rowBlocks(rows), rowThreads(d), 0, ctx.stream>>>(
      x.f32(), c.in[1].f32(), eps, rows, d, c.out[0].f32(), c.out[1].f32());
  checkLaunch("rms_norm");
}

// in = [dy, x, w, y, rstd], out = [dx, dw].
void rmsNormBackward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[1];
  int64_t d = lastDim(x), rows = rowsOf(x);
  const float *dy = c.in[0].f32(), *w = c.in[2].f32(), *rstd = c.in[4].f32();
  GradOut dx = gradOut(c, 0);
  if (dx && rows > 0) {
    rmsNormGradKernel<<<rowBlocks(rows), rowThreads(d), 0, ctx.stream>>>(dy, x.f32(), w, rstd, rows,
                                                                         d, dx);
    checkLaunch("rms_norm backward");
  }
  paramGrads(ctx, storedOf(c.in[0]), storedOf(x), Stored{}, storedOf(c.in[4]), rows, d,
             gradOut(c, 1), GradOut{});
}

} // namespace

void layerNorm(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return layerNormForward(c, ctx);
  layerNormBackward(c, ctx);
}

void rmsNorm(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return rmsNormForward(c, ctx);
  rmsNormBackward(c, ctx);
}

} // namespace epl::backend::cuda
