// Compile-time values of the elaborator: numbers, words, symbolic dims and tensors.
#pragma once
#include "ir/Types.h"

#include <cstdint>
#include <string>
#include <vector>

namespace epl::frontend {

struct Value {
  enum class Kind { Int, Float, Bool, String, Word, None, Auto, Dim, Tensor, List, Record };
  Kind kind = Kind::None;
  int64_t i = 0;
  double f = 0;
  std::string s; // String and Word
  ir::Dim dim;   // Dim: a symbolic dimension such as B
  int tensor = -1;
  std::vector<Value> items;
  bool isSize = false; // an Int written with a unit (25MB): a count of bytes

  static Value ofInt(int64_t v) {
    Value x;
    x.kind = Kind::Int;
    x.i = v;
    return x;
  }
  static Value ofFloat(double v) {
    Value x;
    x.kind = Kind::Float;
    x.f = v;
    return x;
  }
  static Value ofBool(bool v) {
    Value x;
    x.kind = Kind::Bool;
    x.i = v;
    return x;
  }
  static Value ofString(std::string v) {
    Value x;
    x.kind = Kind::String;
    x.s = std::move(v);
    return x;
  }
  static Value ofWord(std::string v) {
    Value x;
    x.kind = Kind::Word;
    x.s = std::move(v);
    return x;
  }
  static Value ofTensor(int t) {
    Value x;
    x.kind = Kind::Tensor;
    x.tensor = t;
    return x;
  }
  // A dim: an Int when it is a constant, a Dim otherwise.
  static Value ofDim(const ir::Dim& d) {
    if (d.isConstant()) return ofInt(d.coef);
    Value x;
    x.kind = Kind::Dim;
    x.dim = d;
    return x;
  }
  bool isNumber() const { return kind == Kind::Int || kind == Kind::Float; }
  double number() const { return kind == Kind::Int ? static_cast<double>(i) : f; }
  ir::Dim asDim() const { return kind == Kind::Dim ? dim : ir::Dim::constant(i); }
};

// "an integer", "a tensor", … for error messages.
const char* kindName(Value::Kind k);

} // namespace epl::frontend
