// layer_norm and rms_norm over the last dim, and batch_norm over every dim but the channels',
// on the GPU, ported from backend/cpu/Norms.cpp, with the same saved tensors (mean and rstd
// per row, or per channel). Rows run one block each with a
// fixed-order tree reduction; the weight and bias gradients sum blocks of kBlockRows rows
// into partials (one thread per block and column, rows in order), then add the partials in
// block order, so every sum is the same on every run. Under amp, layer_norm reads and writes
// its half-precision tensors as they are stored (Common.cuh's Stored), as on the CPU.
//
// batch_norm sums each channel in double, one block a channel in a fixed tree order (the CPU
// adds in element order: the two agree to the double sums' rounding, far below f32's). Where
// ranks share a micro-batch (KernelCall::sumOverReaders), the sums go to the host to be
// summed over them, the one host synchronisation of these kernels.
//
// Shape legend: N rows (every dim but the last), D width, P row blocks; batch_norm's x is
// [B, C, S...]: B samples, C channels, S elements of a channel in a sample.
#include "backend/cuda/Common.cuh"

#include <vector>

namespace epl::backend::cuda {

namespace {

constexpr int64_t kBlockRows = 32;

// The sum of v (float, or batch_norm's double) over the block, returned to every thread.
// blockDim.x is a multiple of 32; the butterfly and the tree add in an order fixed by the
// block size.
template <class T> __device__ T warpSum(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T> __device__ T blockSum(T v) {
  __shared__ T part[32];
  v = warpSum(v);
  unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads(); // a previous call may still be reading `part`
  if (lane == 0) part[warp] = v;
  __syncthreads();
  return warpSum(lane < blockDim.x / 32 ? part[lane] : T(0));
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

// batch_norm's view of x [B, C, S...].
struct Channels {
  int64_t b, c, s;
  // Element t of channel k (t over its B S elements, in the CPU's order).
  __device__ int64_t at(int64_t k, int64_t t) const { return (t / s * c + k) * s + t % s; }
  __device__ int64_t channelOf(int64_t j) const { return j / s % c; }
};

Channels channelsOf(const TensorView& x) {
  int64_t bc = x.shape[0] * x.shape[1];
  return {x.shape[0], x.shape[1], x.numel() / std::max<int64_t>(bc, 1)};
}

constexpr unsigned kChannelThreads = 256;

// sums[2k] = the sum of channel k's x, sums[2k + 1] = that of its squares, in double.
__global__ void channelMomentsKernel(const float* x, Channels ch, double* sums) {
  for (int64_t k = blockIdx.x; k < ch.c; k += gridDim.x) {
    double s1 = 0, s2 = 0;
    for (int64_t t = threadIdx.x; t < ch.b * ch.s; t += blockDim.x) {
      float v = x[ch.at(k, t)];
      s1 += v;
      s2 += static_cast<double>(v) * v;
    }
    s1 = blockSum(s1);
    s2 = blockSum(s2);
    if (threadIdx.x == 0) {
      sums[2 * k] = s1;
      sums[2 * k + 1] = s2;
    }
  }
}

// sums[2k] = the sum of channel k's dy, sums[2k + 1] = that of dy xhat, in double.
__global__ void channelGradSumsKernel(const float* dy, const float* x, const float* mean,
                                      const float* rstd, Channels ch, double* sums) {
  for (int64_t k = blockIdx.x; k < ch.c; k += gridDim.x) {
    double g1 = 0, g2 = 0;
    float m = mean[k], r = rstd[k];
    for (int64_t t = threadIdx.x; t < ch.b * ch.s; t += blockDim.x) {
      int64_t j = ch.at(k, t);
      g1 += dy[j];
      g2 += static_cast<double>(dy[j]) * ((x[j] - m) * r);
    }
    g1 = blockSum(g1);
    g2 = blockSum(g2);
    if (threadIdx.x == 0) {
      sums[2 * k] = g1;
      sums[2 * k + 1] = g2;
    }
  }
}

// The batch's mean and rstd from the sums over n elements a channel, and the running ones
// moved towards them (the variance unbiased), in the CPU's double arithmetic.
__global__ void batchStatsKernel(const double* sums, double n, int64_t c, double eps,
                                 double momentum, float* mean, float* rstd, float* runMean,
                                 float* runVar) {
  EPL_GRID_STRIDE(k, c) {
    double m = sums[2 * k] / n, var = fmax(sums[2 * k + 1] / n - m * m, 0.0);
    mean[k] = static_cast<float>(m);
    rstd[k] = static_cast<float>(1 / sqrt(var + eps));
    runMean[k] = static_cast<float>((1 - momentum) * runMean[k] + momentum * m);
    double unbiased = n > 1 ? var * n / (n - 1) : var;
    runVar[k] = static_cast<float>((1 - momentum) * runVar[k] + momentum * unbiased);
  }
}

// Evaluation: the running statistics.
__global__ void runningStatsKernel(const float* runMean, const float* runVar, int64_t c, double eps,
                                   float* mean, float* rstd) {
  EPL_GRID_STRIDE(k, c) {
    mean[k] = runMean[k];
    rstd[k] = static_cast<float>(1 / sqrt(static_cast<double>(runVar[k]) + eps));
  }
}

__global__ void batchNormApplyKernel(const float* x, const float* mean, const float* rstd,
                                     const float* w, const float* b, Channels ch, int64_t n,
                                     float* y) {
  EPL_GRID_STRIDE(j, n) {
    int64_t k = ch.channelOf(j);
    float m = mean[k], scale = rstd[k] * w[k];
    y[j] = (x[j] - m) * scale + b[k];
  }
}

__global__ void batchNormParamGradsKernel(const double* sums, int64_t c, GradOut dw, GradOut db) {
  EPL_GRID_STRIDE(k, c) {
    if (dw.p) dw.put(k, static_cast<float>(sums[2 * k + 1]));
    if (db.p) db.put(k, static_cast<float>(sums[2 * k]));
  }
}

// dx = w rstd (dy - sum(dy) / n - xhat sum(dy xhat) / n).
__global__ void batchNormGradKernel(const float* dy, const float* x, const float* w,
                                    const float* mean, const float* rstd, const double* sums,
                                    double count, Channels ch, int64_t n, GradOut dx) {
  EPL_GRID_STRIDE(j, n) {
    int64_t k = ch.channelOf(j);
    float m = mean[k], r = rstd[k], scale = w[k] * r;
    float mean1 = static_cast<float>(sums[2 * k] / count),
          mean2 = static_cast<float>(sums[2 * k + 1] / count);
    dx.put(j, scale * (dy[j] - mean1 - (x[j] - m) * r * mean2));
  }
}

unsigned channelBlocks(int64_t c) {
  return static_cast<unsigned>(std::clamp<int64_t>(c, 1, 65535));
}

// The per-channel sums (device memory, 2C of them) and the count of elements a channel (B S)
// summed over the ranks that share the micro-batch, through the host; returns the count.
double sumChannelsOverReaders(const KernelCall& c, const Ctx& ctx, double* sums, int64_t channels,
                              double count) {
  if (!c.sumOverReaders) return count;
  std::vector<double> host(static_cast<size_t>(2 * channels + 1));
  size_t bytes = sizeof(double) * static_cast<size_t>(2 * channels);
  check(cudaMemcpyAsync(host.data(), sums, bytes, cudaMemcpyDeviceToHost, ctx.stream),
        "batch_norm: the sums to the host");
  check(cudaStreamSynchronize(ctx.stream), "batch_norm: the sums to the host");
  host.back() = count;
  c.sumOverReaders(host.data(), static_cast<int64_t>(host.size()));
  // From pageable memory the copy has read `host` when it returns.
  check(cudaMemcpyAsync(sums, host.data(), bytes, cudaMemcpyHostToDevice, ctx.stream),
        "batch_norm: the sums to the device");
  return host.back();
}

// in = [x [B, C, ...], w [C], b [C], running_mean [C], running_var [C]],
// out = [y, mean [C], rstd [C]]. Training: the batch's statistics (over every rank sharing
// the micro-batch), which the running ones then move towards by `momentum`; evaluation:
// the running ones.
void batchNormForward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[0];
  Channels ch = channelsOf(x);
  float *mean = c.out[1].f32(), *rstd = c.out[2].f32();
  double eps = attrFloat(c, "eps"), momentum = attrFloat(c, "momentum");
  if (ch.c == 0) return;
  if (c.training) {
    double* sums = static_cast<double*>(ctx.scratch->get(alignUp(16 * ch.c)));
    channelMomentsKernel<<<channelBlocks(ch.c), kChannelThreads, 0, ctx.stream>>>(x.f32(), ch,
                                                                                  sums);
    checkLaunch("batch_norm statistics");
    double n = sumChannelsOverReaders(c, ctx, sums, ch.c, static_cast<double>(ch.b * ch.s));
    batchStatsKernel<<<blocksFor(ch.c), kThreads, 0, ctx.stream>>>(
        sums, n, ch.c, eps, momentum, mean, rstd, c.in[3].f32(), c.in[4].f32());
  } else {
    runningStatsKernel<<<blocksFor(ch.c), kThreads, 0, ctx.stream>>>(c.in[3].f32(), c.in[4].f32(),
                                                                     ch.c, eps, mean, rstd);
  }
  checkLaunch("batch_norm statistics");
  int64_t n = x.numel();
  if (n == 0) return;
  batchNormApplyKernel<<<blocksFor(n), kThreads, 0, ctx.stream>>>(
      x.f32(), mean, rstd, c.in[1].f32(), c.in[2].f32(), ch, n, c.out[0].f32());
  checkLaunch("batch_norm");
}

// in = [dy, x, w, b, running_mean, running_var, y, mean, rstd],
// out = [dx, dw, db, d running_mean, d running_var (zero)]. dw and db are this rank's
// share (the gradients' reduction adds the ranks'); dx's sums are the whole micro-batch's.
void batchNormBackward(const KernelCall& c, const Ctx& ctx) {
  const TensorView& x = c.in[1];
  Channels ch = channelsOf(x);
  const float *dy = c.in[0].f32(), *mean = c.in[7].f32(), *rstd = c.in[8].f32();
  GradOut dx = gradOut(c, 0), dw = gradOut(c, 1), db = gradOut(c, 2);
  for (int o = 3; o < 5; ++o)
    if (GradOut state = gradOut(c, o); state && !state.acc)
      check(cudaMemsetAsync(state.p, 0, sizeof(float) * static_cast<size_t>(ch.c), ctx.stream),
            "batch_norm backward");
  if (ch.c == 0) return;
  double* sums = static_cast<double*>(ctx.scratch->get(alignUp(16 * ch.c)));
  channelGradSumsKernel<<<channelBlocks(ch.c), kChannelThreads, 0, ctx.stream>>>(dy, x.f32(), mean,
                                                                                 rstd, ch, sums);
  checkLaunch("batch_norm backward sums");
  if (dw || db) {
    batchNormParamGradsKernel<<<blocksFor(ch.c), kThreads, 0, ctx.stream>>>(sums, ch.c, dw, db);
    checkLaunch("batch_norm parameter gradients");
  }
  if (!dx || x.numel() == 0) return;
  double count = sumChannelsOverReaders(c, ctx, sums, ch.c, static_cast<double>(ch.b * ch.s));
  batchNormGradKernel<<<blocksFor(x.numel()), kThreads, 0, ctx.stream>>>(
      dy, x.f32(), c.in[2].f32(), mean, rstd, sums, count, ch, x.numel(), dx);
  checkLaunch("batch_norm backward");
}

} // namespace

void batchNorm(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return batchNormForward(c, ctx);
  batchNormBackward(c, ctx);
}

void layerNorm(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return layerNormForward(c, ctx);
  layerNormBackward(c, ctx);
}

void rmsNorm(const KernelCall& c, const Ctx& ctx) {
  if (!c.backward) return rmsNormForward(c, ctx);
  rmsNormBackward(c, ctx);
}

} // namespace epl::backend::cuda
