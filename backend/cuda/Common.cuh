// Helpers for the CUDA kernel files: launch geometry and grid-stride loops.
#pragma once
#include "backend/cuda/Kernels.h"

#include <algorithm>
#include <cstdint>
#include <cuda_fp16.h>

namespace epl::backend::cuda {

constexpr int kThreads = 256;

// f32 to bf16, nearest even; a NaN stays a (quiet) NaN. Wire.h's toBf16.
__device__ inline uint16_t toBf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t kept = u >> 16, dropped = u & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u))) ++kept;
  return static_cast<uint16_t>(kept);
}

__device__ inline float fromBf16(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// f32 to IEEE half, nearest even (overflow to infinity, subnormals kept); Wire.cpp's toF16
// for every value but NaN's payload, which Wire.cpp makes 0x7e00 too.
__device__ inline uint16_t toF16(float x) {
  if (isnan(x)) return static_cast<uint16_t>((__float_as_uint(x) >> 16 & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(x));
}

__device__ inline float fromF16(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// Element i of an operand (f32, bf16 or IEEE half), in f32.
__device__ inline float loadAs(const void* x, int64_t i, ir::DType t) {
  if (t == ir::DType::F32) return static_cast<const float*>(x)[i];
  uint16_t h = static_cast<const uint16_t*>(x)[i];
  return t == ir::DType::BF16 ? fromBf16(h) : fromF16(h);
}

// Element i of x (f32, bf16 or IEEE half) set to v, rounded to nearest even.
__device__ inline void storeAs(void* x, int64_t i, ir::DType t, float v) {
  if (t == ir::DType::F32)
    static_cast<float*>(x)[i] = v;
  else
    static_cast<uint16_t*>(x)[i] = t == ir::DType::BF16 ? toBf16(v) : toF16(v);
}

// A tensor's elements as stored (f32, or under amp bf16 or IEEE half), read and written in
// f32, for the kernels that take half precision as stored (ir::OpInfo::halfAsStored): the
// same values as the f32 kernel on widened copies, rounded where they are stored.
struct Stored {
  void* p = nullptr;
  ir::DType t = ir::DType::F32;
  __device__ float operator[](int64_t i) const { return loadAs(p, i, t); }
  __device__ void set(int64_t i, float v) const { storeAs(p, i, t, v); }
};
inline Stored storedOf(const TensorView& v) {
  return {v.data, v.dtype};
}
// A gradient as stored: put(i, v) sets element i, or adds v to it when the call adds into
// the gradient (its sum in f32, then rounded).
struct StoredGrad {
  Stored x;
  bool acc = false;
  explicit operator bool() const { return x.p != nullptr; }
  __device__ void put(int64_t i, float v) const { x.set(i, acc ? x[i] + v : v); }
};
inline StoredGrad storedGrad(const KernelCall& c, size_t i) {
  return {storedOf(c.out.at(i)), accumulates(c, i)};
}

// Blocks for a grid-stride loop over n elements (at most 65,535 x 16; the loop covers the rest).
inline unsigned blocksFor(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, int64_t{65535} * 16));
}

// Blocks of the first pass of a reduction over n elements: from n alone, so the order of the
// additions does not depend on the GPU.
inline unsigned reductionParts(int64_t n) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((n + 16 * kThreads - 1) / (16 * kThreads), 1, 1024));
}

// Pieces of one scratch buffer start at multiples of this.
constexpr int64_t kScratchAlign = 256;
inline int64_t alignUp(int64_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

// Combining operations for reductions.
struct Sum {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

#define EPL_GRID_STRIDE(i, n)                                                                      \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);           \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

} // namespace epl::backend::cuda
