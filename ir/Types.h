// Element types, symbolic dimensions and shapes of IR tensors.
//
// Shape legend used across EPL: B batch, T time (sequence), D model width, H heads,
// V vocab, C channels, E experts, F hidden (feed-forward) width.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace epl::ir {

enum class DType { F32, F16, BF16, I32, I64 };

const char* dtypeName(DType t);
std::optional<DType> parseDType(const std::string& name);
int64_t dtypeBytes(DType t);
bool isIntegral(DType t);
// bf16 or fp16: what `amp` stores activations in.
bool isHalf(DType t);

// A dimension: a constant times a product of named symbols (`B`, `4*B`, `128`).
struct Dim {
  int64_t coef = 1;
  std::vector<std::string> syms; // sorted, may repeat

  static Dim constant(int64_t v) { return Dim{v, {}}; }
  static Dim symbol(std::string s) { return Dim{1, {std::move(s)}}; }
  bool isConstant() const { return syms.empty(); }
  // The product; nullopt when its constant does not fit in 64 bits.
  std::optional<Dim> times(const Dim& o) const;
  // Exact division by a constant; nullopt when it does not divide.
  std::optional<Dim> divide(int64_t d) const;
  bool operator==(const Dim& o) const { return coef == o.coef && syms == o.syms; }
  bool operator!=(const Dim& o) const { return !(*this == o); }
  // The value under bindings of its symbols; nullopt if one is unbound or the value does
  // not fit in 64 bits (the front end and mesh-assignment refuse such sizes).
  std::optional<int64_t> eval(const std::map<std::string, int64_t>& bindings) const;
  std::string str() const;
};

using Shape = std::vector<Dim>;
std::string shapeStr(const Shape& s);

struct TensorType {
  DType dtype = DType::F32;
  Shape shape;
  std::string str() const; // f32[B, 128, 256]
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
};

// Elements of a shape under bindings; nullopt if a symbol is unbound or the count does
// not fit in 64 bits.
std::optional<int64_t> numElements(const Shape& s, const std::map<std::string, int64_t>& b);

// Bytes of a tensor type with its symbols bound by `b`, a symbol without a binding
// counting as 1 (the least it can be); nullopt when the count does not fit in 64 bits.
// Each tensor a model makes must fit: sizes are checked where they arise, so the passes
// can add them up without overflow.
std::optional<int64_t> checkedBytes(const TensorType& t, const std::map<std::string, int64_t>& b);

} // namespace epl::ir
