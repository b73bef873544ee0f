// amp's staging, the same on every device (backend/cpu/HalfStorage.cpp,
// backend/cuda/HalfStorage.cu): a call that reads or writes half-precision views, or casts
// its weights (KernelCall::castParams), runs its f32 kernel on f32 copies of them, laid out
// side by side as the memory plan sized them (Module::ampStagingBytes: each copy padded to
// 16 floats, at the start of the call's workspace); its half outputs are then rounded back.
// A device brings the conversions and, for a call without a planned workspace, a buffer.
#pragma once
#include "backend/Device.h"

#include <cstdint>

namespace epl::backend {

// Whether the call reads or writes a half-precision view or casts its weights, and its
// kernel takes f32 only (not a kind of ir::OpInfo::halfAsStored, whose kernels convert as
// they go on every device).
bool needsStaging(const KernelCall& c);
// Whether input i is a weight the call reads rounded to castParams.
inline bool castsInput(const KernelCall& c, size_t i) {
  return c.castParams != ir::DType::F32 && i >= c.firstParam && i < c.firstParam + c.paramCount;
}
// Whether output i is one the kernel writes in its half type itself, a block of rows at a
// time through its workspace (ir::OpInfo::halfOutputByRows: linear's forward): no copy.
inline bool writesHalfOutput(const KernelCall& c, size_t i) {
  return !c.backward && i == 0 && ir::opInfo(c.kind).halfOutputByRows;
}
// A copy's floats, padded to 16 (64 bytes), as the memory plan lays them out.
inline int64_t stagingPadded(int64_t floats) {
  return (floats + 15) / 16 * 16;
}
// The inputs (bit i: in[i]) that the call's kernel reads only as operands of its products
// (and of column sums), ir::productInputs: both devices multiply half precision as it is
// stored (cuBLAS; the CPU's gemm natively or widening a piece at a time), so these need
// no f32 copy.
uint64_t productInputs(const KernelCall& c);

// mlp's backward reads its saved h only through the activation, which a device's kernel
// may widen itself, a piece at a time (the CPU's): bit 7 where the call takes the
// products' inputs as they are (`direct`), else 0.
uint64_t widenedInputs(const KernelCall& c, uint64_t direct);

// productInputs(c) where the call computes under amp (its weights cast to a half type t)
// and each of those inputs is a view of type t or a weight cast to t; else 0 (a product
// of a half weight with an f32 input, the model's f32 images: all of it on copies).
uint64_t directInputs(const KernelCall& c);

// The floats of the call's f32 copies, as Module::ampStagingBytes plans them: none for the
// half views of directInputs(c), half the room for its cast weights (rounded to the half
// type into their copy's place), a whole copy for the rest.
int64_t stagingFloats(const KernelCall& c);

// The call with each half view (and each cast weight) replaced by an f32 copy at `at`
// (stagingFloats(c) floats at most): widen(dtype, half, f32, n) fills an input's copy, and
// an output added into; round(dtype, f32, f32, n) a cast weight's. The planned staging is
// taken off the workspace the kernel sees. After the kernel, narrowOutputs. The inputs of
// `direct` (directInputs, and a device's widenedInputs) stay as they are, and their cast
// weights are rounded to the half type itself (narrow(dtype, f32, half, n)) into half a
// copy's room.
template <class Widen, class Round, class Narrow>
KernelCall stagedCall(const KernelCall& c, float* at, Widen&& widen, Round&& round, Narrow&& narrow,
                      uint64_t direct) {
  KernelCall f = c;
  if (c.workspace && c.stagingFloats > 0) {
    f.workspace = c.workspaceFloats > c.stagingFloats ? c.workspace + c.stagingFloats : nullptr;
    f.workspaceFloats = c.workspaceFloats - c.stagingFloats;
    f.stagingFloats = 0;
  }
  for (size_t i = 0; i < c.in.size(); ++i) {
    const TensorView& v = c.in[i];
    if (!v.data || !(ir::isHalf(v.dtype) || castsInput(c, i))) continue;
    bool asIs = direct >> i & 1;
    if (asIs && ir::isHalf(v.dtype)) continue;
    int64_t n = v.numel();
    if (asIs)
      narrow(c.castParams, v.f32(), static_cast<void*>(at), n);
    else if (ir::isHalf(v.dtype))
      widen(v.dtype, v.data, at, n);
    else
      round(c.castParams, v.f32(), at, n);
    f.in[i].data = at;
    f.in[i].dtype = asIs ? c.castParams : ir::DType::F32;
    at += stagingPadded(asIs ? (n + 1) / 2 : n);
  }
  for (size_t i = 0; i < c.out.size(); ++i) {
    const TensorView& v = c.out[i];
    if (!v.data || !ir::isHalf(v.dtype) || writesHalfOutput(c, i)) continue;
    // A gradient added into keeps its sum so far.
    if (i < c.accumulate.size() && c.accumulate[i]) widen(v.dtype, v.data, at, v.numel());
    f.out[i].data = at;
    f.out[i].dtype = ir::DType::F32;
    at += stagingPadded(v.numel());
  }
  return f;
}

// Each half output of c rounded from its f32 copy in f (stagedCall's):
// narrow(dtype, f32, half, n).
template <class Narrow>
void narrowOutputs(const KernelCall& c, const KernelCall& f, Narrow&& narrow) {
  for (size_t i = 0; i < c.out.size(); ++i)
    if (c.out[i].data && ir::isHalf(c.out[i].dtype) && !writesHalfOutput(c, i))
      narrow(c.out[i].dtype, f.out[i].f32(), c.out[i].data, c.out[i].numel());
}

// Whether the memory plan placed the call's `floats` of copies (at its workspace's start);
// else the device brings a buffer of its own (a call of no plan: tests).
inline bool plannedStaging(const KernelCall& c, int64_t floats) {
  return c.workspace && c.stagingFloats >= floats;
}

} // namespace epl::backend
