// Dimension arithmetic and type printing.
#include "ir/Types.h"

#include "support/Checked.h"

#include <algorithm>

namespace epl::ir {

const char* dtypeName(DType t) {
  switch (t) {
  case DType::F32:
    return "f32";
  case DType::F16:
    return "f16";
  case DType::BF16:
    return "bf16";
  case DType::I32:
    return "i32";
  case DType::I64:
    return "i64";
  }
  return "?";
}

std::optional<DType> parseDType(const std::string& name) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64})
    if (name == dtypeName(t)) return t;
  return std::nullopt;
}

int64_t dtypeBytes(DType t) {
  switch (t) {
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::F16:
  case DType::BF16:
    return 2;
  case DType::I64:
    return 8;
  }
  return 4;
}

bool isHalf(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

bool isIntegral(DType t) {
  return t == DType::I32 || t == DType::I64;
}

std::optional<Dim> Dim::times(const Dim& o) const {
  std::optional<int64_t> c = checkedMul(coef, o.coef);
  if (!c) return std::nullopt;
  Dim r{*c, syms};
  r.syms.insert(r.syms.end(), o.syms.begin(), o.syms.end());
  std::sort(r.syms.begin(), r.syms.end());
  if (r.coef == 0) r.syms.clear();
  return r;
}

std::optional<Dim> Dim::divide(int64_t d) const {
  if (d == 0 || (d == -1 && coef == INT64_MIN) || coef % d != 0) return std::nullopt;
  return Dim{coef / d, syms};
}

std::optional<int64_t> Dim::eval(const std::map<std::string, int64_t>& bindings) const {
  std::optional<int64_t> v = coef;
  for (const auto& s : syms) {
    auto it = bindings.find(s);
    if (it == bindings.end()) return std::nullopt;
    v = checkedMul(*v, it->second);
    if (!v) return std::nullopt;
  }
  return v;
}

std::string Dim::str() const {
  std::string out;
  if (coef != 1 || syms.empty()) out = std::to_string(coef);
  for (const auto& s : syms) {
    if (!out.empty()) out += '*';
    out += s;
  }
  return out;
}

std::string shapeStr(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += s[i].str();
  }
  return out + "]";
}

std::string TensorType::str() const {
  return dtypeName(dtype) + shapeStr(shape);
}

std::optional<int64_t> numElements(const Shape& s, const std::map<std::string, int64_t>& b) {
  std::optional<int64_t> n = 1;
  for (const auto& d : s) {
    auto v = d.eval(b);
    if (!v || !(n = checkedMul(*n, *v))) return std::nullopt;
  }
  return n;
}

std::optional<int64_t> checkedBytes(const TensorType& t, const std::map<std::string, int64_t>& b) {
  std::optional<int64_t> n = dtypeBytes(t.dtype);
  for (const auto& d : t.shape) {
    n = checkedMul(*n, d.coef);
    for (const auto& sym : d.syms) {
      auto it = b.find(sym);
      if (n && it != b.end()) n = checkedMul(*n, it->second);
    }
    if (!n) return std::nullopt;
  }
  return n;
}

} // namespace epl::ir
