// The geometry of a kernel call, read the same way by every device: attention's heads,
// pooling windows, convolution and MoE sizes, the activation forms, and the broadcast of a
// binary op's operands. The CPU and CUDA kernels of a family take their sizes from here,
// so the two cannot come to read a call differently.
#pragma once
#include "backend/HostDevice.h"
#include "backend/KernelArgs.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace epl::backend {

// attention over x [B, T, M]: H query heads of width E, D = H E of them on this device
// (all of them, M = D, unless the heads are split), and KV k and v heads, KVD = KV E wide;
// query head i reads k/v head i / (H / KV). Wqkv is [D + 2 KVD, M] (q, k, v rows), Wp
// [M, D]; a row of qkv is `ld` = D + 2 KVD wide. With `rotary`, q and k turn by the
// angles t base^(-2i / E) (backend/cpu/Attention.cpp).
struct AttentionDims {
  int64_t b, t, d, h, e, m;
  float scale; // 1 / sqrt(E)
  bool causal;
  int64_t kv = 0, kvd = 0, ld = 0;
  bool rotary = false;
  double rotaryBase = 10000;
  int64_t group() const { return h / kv; } // query heads per k/v head
};
AttentionDims attentionDims(const KernelCall& c, const TensorView& x, const TensorView& wqkv);

// Where attention's tensors sit in a call (ir::attentionSlots).
using AttentionSlots = ir::AttentionSlots;
AttentionSlots attentionSlots(const KernelCall& c);

// max_pool, avg_pool over x [B, C, H, W]: `planes` = B C planes of H x W, windows of k x k
// every `stride`, Ho x Wo of them.
struct PoolWindow {
  int64_t planes, h, w, k, stride, ho, wo;
};
PoolWindow poolWindow(const KernelCall& c, const TensorView& x);

// conv2d of x [B, C, H, W] with w [Co, C, K, K]: output [B, Co, Ho, Wo]. Images go through
// im2col in groups of group() images, at most ir::kConvColBudget floats of columns a group.
struct ConvGeometry {
  int64_t b, c, h, w, co, k, stride, pad, ho, wo;
  EPL_HOST_DEVICE int64_t plane() const { return ho * wo; }
  EPL_HOST_DEVICE int64_t ckk() const { return c * k * k; }
  int64_t group() const { return ir::convGroup(ckk(), plane(), b); }
};
ConvGeometry convGeometry(const KernelCall& c, const TensorView& x, const TensorView& w);

// moe_dispatch and moe_combine: N tokens of width D in samples of T tokens (N = B T), E
// experts, each token to its top K, each expert taking at most `cap` of a sample's token
// copies (capacity_factor x T x K / E rounded up; T K when the factor is 0, no limit).
// The tokens are in[1] of a backward call (after the gradient), in[0] of a forward.
struct MoeRouting {
  int64_t n, t, d, e, k, cap;
  double auxWeight;
};
MoeRouting moeRouting(const KernelCall& c);

// The activation forms of mlp and moe: "gelu" (tanh form), "gelu_exact" (with erf), "relu",
// "silu"; and of the gelu op: its `approx` (tanh, or none for the exact form).
enum class Act { Gelu, GeluExact, Relu, Silu };
Act parseAct(const std::string& word);
Act geluForm(const KernelCall& c);

// transpose of dims dim0 and dim1 of src: [A, I, M, J, N] -> [A, J, M, I, N]; `same` when
// the two dims are one (the transpose is a copy).
struct TransposeDims {
  int64_t a, i, m, j, n;
  bool same;
};
TransposeDims transposeDims(const KernelCall& c, const TensorView& src);

// mean, select and narrow view x as [O, N, I] around the call's `dim` (negative counts from
// the end): O the dims before it, N its size, I the dims after it.
struct AroundDim {
  int64_t o = 1, n = 1, i = 1;
};
AroundDim aroundDim(const KernelCall& c, const std::vector<int64_t>& x);
// The run [start, start + len) of the dim that select (len 1) or narrow keeps, of n indices.
struct KeptRun {
  int64_t start, len;
};
KeptRun keptRun(const KernelCall& c, int64_t n);

// A binary op's operands a and b broadcast to `out`: the output's dims with size-1 dims
// dropped and neighbours merged while both operands stay contiguous across them, and each
// operand's stride per merged dim (0 where it is broadcast).
struct BroadcastNest {
  std::vector<int64_t> dims, sa, sb;
};
BroadcastNest broadcastNest(const std::vector<int64_t>& out, const std::vector<int64_t>& a,
                            const std::vector<int64_t>& b);
// Whether a and b are one shape once the shorter is padded with leading 1s.
bool sameShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

} // namespace epl::backend
