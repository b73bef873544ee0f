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
