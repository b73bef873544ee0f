// What a kernel call carries, read the same way by every device: attributes with the op
// table's defaults, gradient outputs with their accumulate flag, arity checks and the
// row/column view of a tensor. Host code only; a device's kernels get plain numbers.
//
// Shape legend: N rows (every dim but the last), C columns (the last dim).
#pragma once
#include "backend/Device.h"
#include "backend/HostDevice.h"

#include <cstdint>
#include <string>

namespace epl::backend {

// Attributes of the call, falling back to the op table's default for a missing optional one.
int64_t attrInt(const KernelCall& c, const std::string& key);
double attrFloat(const KernelCall& c, const std::string& key);
bool attrBool(const KernelCall& c, const std::string& key);
// The call's attributes, none where it has no map.
const ir::Attrs& attrsOf(const KernelCall& c);
std::string attrWord(const KernelCall& c, const std::string& key);

// One gradient output: null when not wanted; `acc` adds into it instead of overwriting.
struct GradOut {
  float* p = nullptr;
  bool acc = false;
  explicit operator bool() const { return p != nullptr; }
  float beta() const { return acc ? 1.f : 0.f; } // for a gemm into it
  // p[i] = v, or += v; on the host for host memory, in a kernel for device memory.
  EPL_HOST_DEVICE void put(int64_t i, float v) const { p[i] = acc ? p[i] + v : v; }
};
GradOut gradOut(const KernelCall& c, size_t i);
// Whether the call adds into its output i (a gradient) instead of overwriting it.
bool accumulates(const KernelCall& c, size_t i);

// An operand of a product: f32, or (amp) bf16 or IEEE half that the product reads as it is
// stored (HalfStaging.h, directInputs). Both operands of a product have one type; a half
// product's multiplications are exact in f32 and its sums are f32, so it differs from the
// f32 product of the widened operands only by the order of its additions.
struct Operand {
  const void* p = nullptr;
  ir::DType type = ir::DType::F32;
  Operand(const float* f) : p(f) {} // NOLINT: a float array is an f32 operand
  Operand(const void* data, ir::DType t) : p(data), type(t) {}
  // The operand from element `elements` on.
  Operand at(int64_t elements) const {
    return {static_cast<const char*>(p) + elements * (type == ir::DType::F32 ? 4 : 2), type};
  }
};
// A view as an operand: f32, or half where the call reads it as it is.
inline Operand operandOf(const TensorView& v) {
  return {v.data, v.dtype};
}

// The call has as many inputs and outputs as its op's layout gives (ir::callArity).
void expectArity(const KernelCall& c);

inline int64_t lastDim(const TensorView& t) {
  return t.shape.empty() ? 1 : t.shape.back();
}
inline int64_t rowsOf(const TensorView& t) {
  int64_t c = lastDim(t);
  return c == 0 ? 0 : t.numel() / c;
}

} // namespace epl::backend
