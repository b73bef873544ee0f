// amp on the CPU device: tensors stored in bf16 or IEEE half, computed in f32. A call that
// reads or writes a half view runs its f32 kernel on widened copies (kept in one grow-only
// buffer), and its half outputs are rounded back to nearest even; a call that casts its
// weights (KernelCall::castParams) reads them rounded to the half type. The arithmetic is
// the f32 kernels' own, so a GPU's half-precision kernels differ from it only by their
// accumulation order. The memory plan places the widened copies (Module::ampStagingBytes)
// in the call's workspace; the CUDA device does the same (backend/cuda/HalfStorage.cu).
#include "backend/comm/Wire.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Parallel.h"
#include "support/Assert.h"

#include <cstdlib>
#include <memory>

namespace epl::backend::cpu {

namespace {

using ir::isHalf;

constexpr int64_t kGrain = 1 << 14;

// The wire format of the same 16 bits: its decode and encode (scale 1) are the conversions.
WireType wireOf(ir::DType t) {
  return t == ir::DType::BF16 ? WireType::BF16 : WireType::F16;
}

void widen(ir::DType t, const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  parallelFor(n, kGrain,
              [&](int64_t a, int64_t b) { wire::decode(wireOf(t), h + a, dst + a, b - a, 1.f); });
}

void narrow(ir::DType t, const float* src, void* dst, int64_t n) {
  uint16_t* h = static_cast<uint16_t*>(dst);
  parallelFor(n, kGrain,
              [&](int64_t a, int64_t b) { wire::encode(wireOf(t), src + a, h + a, b - a, 1.f); });
}

// dst = src rounded to the half type t and back.
void round(ir::DType t, const float* src, float* dst, int64_t n) {
  parallelFor(n, kGrain, [&](int64_t a, int64_t b) {
    if (t == ir::DType::BF16)
      for (int64_t i = a; i < b; ++i)
        dst[i] = wire::fromBf16(wire::toBf16(src[i]));
    else
      for (int64_t i = a; i < b; ++i)
        dst[i] = wire::fromF16(wire::toF16(src[i]));
  });
}

// The widened copies of one call, side by side, each 64-byte aligned.
float* stagingBuffer(int64_t floats) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<float, Free> buffer;
  thread_local int64_t capacity = 0;
  if (floats > capacity) {
    int64_t bytes = (floats * 4 + 63) / 64 * 64;
    buffer.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
    EPL_ASSERT(buffer, "out of memory for amp's f32 copies");
    capacity = bytes / 4;
  }
  return buffer.get();
}

int64_t padded(int64_t floats) {
  return (floats + 15) / 16 * 16;
}

} // namespace

bool needsStaging(const KernelCall& c) {
  if (c.castParams != ir::DType::F32 && c.paramCount > 0) return true;
  for (const auto* views : {&c.in, &c.out})
    for (const TensorView& v : *views)
      if (v.data && isHalf(v.dtype)) return true;
  return false;
}

void launchStaged(const KernelCall& c, void (*run)(const KernelCall&)) {
  auto cast = [&](size_t i) {
    return c.castParams != ir::DType::F32 && i >= c.firstParam && i < c.firstParam + c.paramCount;
  };
  int64_t total = 0;
  for (size_t i = 0; i < c.in.size(); ++i)
    if (c.in[i].data && (isHalf(c.in[i].dtype) || cast(i))) total += padded(c.in[i].numel());
  for (const TensorView& v : c.out)
    if (v.data && isHalf(v.dtype)) total += padded(v.numel());
  // The memory plan's place for the copies (at the workspace's start), or a buffer of the
  // device's own for a call without one.
  KernelCall f = c;
  float* at = c.workspace && c.stagingFloats >= total ? c.workspace : stagingBuffer(total);
  if (c.workspace && c.stagingFloats > 0) {
    f.workspace = c.workspaceFloats > c.stagingFloats ? c.workspace + c.stagingFloats : nullptr;
    f.workspaceFloats = c.workspaceFloats - c.stagingFloats;
    f.stagingFloats = 0;
  }
  for (size_t i = 0; i < c.in.size(); ++i) {
    const TensorView& v = c.in[i];
    if (!v.data || !(isHalf(v.dtype) || cast(i))) continue;
    int64_t n = v.numel();
    if (isHalf(v.dtype))
      widen(v.dtype, v.data, at, n);
    else
      round(c.castParams, v.f32(), at, n);
    f.in[i].data = at;
    f.in[i].dtype = ir::DType::F32;
    at += padded(n);
  }
  for (size_t i = 0; i < c.out.size(); ++i) {
    const TensorView& v = c.out[i];
    if (!v.data || !isHalf(v.dtype)) continue;
    // A gradient added into keeps its sum so far.
    if (i < c.accumulate.size() && c.accumulate[i]) widen(v.dtype, v.data, at, v.numel());
    f.out[i].data = at;
    f.out[i].dtype = ir::DType::F32;
    at += padded(v.numel());
  }
  run(f);
  for (size_t i = 0; i < c.out.size(); ++i)
    if (c.out[i].data && isHalf(c.out[i].dtype))
      narrow(c.out[i].dtype, f.out[i].f32(), c.out[i].data, c.out[i].numel());
}

} // namespace epl::backend::cpu
