// What each op's backward needs from its forward: extra tensors the forward saves, and
// whether it reads the op's inputs or output again. Autodiff keeps exactly these alive.
//
// Shape legend: B batch, T time, D width, H heads, E experts, F hidden width.
#pragma once
#include "ir/Ops.h"

namespace epl::ir {

struct GradInfo {
  bool differentiable = true; // false: no backward at all (next, integer-only ops)
  bool needsInputs = false;   // backward reads the op's tensor inputs
  bool needsOutput = false;   // backward reads the op's output
  // Written by the forward after its outputs, read by the backward:
  //   layer_norm  mean f32[rows], rstd f32[rows]   (rows = every dim but the last)
  //   rms_norm    rstd f32[rows]
  //   attention   qkv f32[B, T, 3D], ctx f32[B, T, D] (heads joined, before the output
  //               projection), lse f32[B, H, T] (log-sum-exp of each softmax row)
  //   mlp         h f32[..., F] (first linear's output, before the activation)
  //   moe_experts h f32[B, R k, F] (each row's first linear, before the activation)
  //   max_pool    argmax i32[B, C, H', W'] (flat index into the input's H x W plane)
  //   cross_entropy lse f32[rows] (log-sum-exp of each row of logits)
  std::vector<TensorType> saved;
};

GradInfo gradInfo(OpKind kind, const std::vector<TensorType>& in, const Attrs& attrs);

} // namespace epl::ir
