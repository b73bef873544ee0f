// Entry points of the CPU kernel families, one family per file; CpuDevice.cpp dispatches
// each KernelCall to one of these by op kind. Each runs the forward or, when
// `call.backward`, the backward, with the argument layout of backend/Device.h.
#pragma once
#include "backend/Device.h"
#include "backend/KernelShapes.h"

namespace epl::backend::cpu {

// Linear.cpp
void linear(const KernelCall& c);
// Embedding.cpp
void embedding(const KernelCall& c);
void positions(const KernelCall& c);
// Norms.cpp
void layerNorm(const KernelCall& c);
void rmsNorm(const KernelCall& c);
void batchNorm(const KernelCall& c);
// Attention.cpp
void attention(const KernelCall& c);
// Mlp.cpp
void mlp(const KernelCall& c);
// Moe.cpp
void moe(const KernelCall& c);
// Conv.cpp
void conv2d(const KernelCall& c);
// Pooling.cpp
void maxPool(const KernelCall& c);
void avgPool(const KernelCall& c);
// Activations.cpp
void gelu(const KernelCall& c);
void relu(const KernelCall& c);
void silu(const KernelCall& c);
void tanh(const KernelCall& c);
void sigmoid(const KernelCall& c);
void softmax(const KernelCall& c);
void dropout(const KernelCall& c);
// Elementwise.cpp
void add(const KernelCall& c);
void sub(const KernelCall& c);
void mul(const KernelCall& c);
void scale(const KernelCall& c);
void reshape(const KernelCall& c); // flatten and reshape: a copy
void transpose(const KernelCall& c);
// Slicing.cpp
void mean(const KernelCall& c);
void keepRun(const KernelCall& c); // select and narrow
// Losses.cpp
void crossEntropy(const KernelCall& c);
void mse(const KernelCall& c);
// Optimizers.cpp
void optimizerStep(const OptimizerCall& c);
void sumSquares(const TensorView& x, float* result, bool accumulate);
void scaleInPlace(const TensorView& x, float factor);

// HalfStorage.cpp (amp; backend/HalfStaging.h says which calls): `run` (the f32 dispatch)
// on widened copies, its half outputs rounded back.
void launchStaged(const KernelCall& c, void (*run)(const KernelCall&));

// Shared by families: activation forms used by mlp and moe (Activations.cpp).
// y = act(x), n elements.
void actForward(Act a, const float* x, float* y, int64_t n);
// g *= act'(x), n elements (g holds dL/dy on entry, dL/dx on exit).
void actBackwardInPlace(Act a, const float* x, float* g, int64_t n);
// y = act(x) and dydx = act'(x) in one pass (gelu's tanh once for both).
void actForwardAndGrad(Act a, const float* x, float* y, float* dydx, int64_t n);

} // namespace epl::backend::cpu
