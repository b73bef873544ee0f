// attention's tiled kernels on tensor cores (FlashAttention.cu): the scores of a tile of
// queries against a tile of keys stay in shared memory, never in device memory. Attention.cu
// takes them where flashAttentionRuns says, and its cuBLAS products over scores in scratch
// elsewhere; both read and write the same tensors (qkv, ctx, lse and dqkv, as on the CPU).
#pragma once
#include "backend/cuda/FlashTiles.cuh"
#include "backend/cuda/Kernels.h"

namespace epl::backend::cuda {

// Whether the tiled kernels run an attention of these dims: heads at most 128 wide, and this
// GPU's shared memory for their tiles. Their products are TF32's under `matmul = tf32`, and
// fp32's otherwise (three TF32 products each: FlashTiles.cuh). EPL_GPU_ATTENTION=scores keeps
// every attention on cuBLAS's products over scores in scratch (to compare the two).
bool flashAttentionRuns(const AttentionDims& s);

// ctx [B, T, D] and lse [B, H, T] from qkv [B, T, LD] (q and k already turned by rotary).
// qkvTf32: qkv holds TF32 values (amp rounded it to its half type), which fp32's products
// take as they are (Flash::qkvTf32).
void flashAttentionForward(const Ctx& ctx, const AttentionDims& s, const float* qkv, bool qkvTf32,
                           MaskRows mask, float* ctxOut, float* lse);

// Every column of dqkv [B, T, LD] (dq, dk, dv; written, not added to) from qkv, lse, dctx
// [B, T, D] and dvec [B, H, T] = rowsum(dctx * ctx).
void flashAttentionBackward(const Ctx& ctx, const AttentionDims& s, const float* qkv, bool qkvTf32,
                            const float* lse, const float* dctx, const float* dvec, MaskRows mask,
                            float* dqkv);

} // namespace epl::backend::cuda
