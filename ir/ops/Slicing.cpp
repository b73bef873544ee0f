// mean, select and narrow: reduce one dim, or keep some of its indices (a [CLS] head's
// `select(h, 1, 0)`, mean-pooling's `mean(h, 1)`). None of them may touch dim 0, the
// batch: the front end checks that (Elaborator::checkBatchKept).
#include "ir/ops/Family.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

// The dim attribute `key` of `op` on tensor `x`, negative counting from the end, in range.
std::string dimIndex(const std::string& op, const TensorType& x, const Attrs& attrs,
                     const std::string& key, int64_t& d) {
  int64_t r = static_cast<int64_t>(x.shape.size());
  d = intAttr(attrs, key);
  if (d < 0) d += r;
  if (d < 0 || d >= r)
    return fmt::format("`{}` dim {} out of range for {} (dims {} to {})", op, intAttr(attrs, key),
                       tensorStr(x), -r, r - 1);
  return "";
}

// The size of dim d of x, which must be a known integer (indices are checked against it).
std::string knownDim(const std::string& op, const TensorType& x, int64_t d, int64_t& n) {
  const Dim& s = x.shape[d];
  if (!s.syms.empty())
    return fmt::format("`{}` needs a known size of dim {}, got `{}` in {}", op, d, s.str(),
                       tensorStr(x));
  n = s.coef;
  return "";
}

std::string inferMean(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                      std::vector<TensorType>& out) {
  int64_t d = 0;
  if (std::string e = needFloat("mean", in[0]); !e.empty()) return e;
  if (std::string e = dimIndex("mean", in[0], attrs, "dim", d); !e.empty()) return e;
  Shape s = in[0].shape;
  auto keep = attrs.find("keepdim");
  if (keep != attrs.end() && std::get<bool>(keep->second))
    s[d] = constant(1);
  else
    s.erase(s.begin() + d);
  out.push_back(TensorType{in[0].dtype, s});
  return "";
}

std::string inferSelect(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                        std::vector<TensorType>& out) {
  int64_t d = 0, n = 0, i = intAttr(attrs, "index");
  if (std::string e = dimIndex("select", in[0], attrs, "dim", d); !e.empty()) return e;
  if (std::string e = knownDim("select", in[0], d, n); !e.empty()) return e;
  if (i < -n || i >= n)
    return fmt::format("`select` index {} out of range for dim {} of size {} (indices {} to {})", i,
                       d, n, -n, n - 1);
  Shape s = in[0].shape;
  s.erase(s.begin() + d);
  out.push_back(TensorType{in[0].dtype, s});
  return "";
}

std::string inferNarrow(const OpInfo&, const std::vector<TensorType>& in, const Attrs& attrs,
                        std::vector<TensorType>& out) {
  int64_t d = 0, n = 0, start = intAttr(attrs, "start"), len = intAttr(attrs, "length");
  if (std::string e = dimIndex("narrow", in[0], attrs, "dim", d); !e.empty()) return e;
  if (std::string e = knownDim("narrow", in[0], d, n); !e.empty()) return e;
  if (start < -n || start >= n)
    return fmt::format("`narrow` start {} out of range for dim {} of size {} (indices {} to {})",
                       start, d, n, -n, n - 1);
  if (start < 0) start += n;
  if (len <= 0) return fmt::format("`narrow` length must be positive, got {}", len);
  if (start + len > n)
    return fmt::format("`narrow` of indices {} to {} passes the end of dim {} (size {})", start,
                       start + len - 1, d, n);
  Shape s = in[0].shape;
  s[d] = constant(len);
  out.push_back(TensorType{in[0].dtype, s});
  return "";
}

} // namespace

void addSlicing(Table& t) {
  using S = SplitRule;
  t.add(OpKind::Mean, "mean",
        {x(), integer("dim", "the dim to average (negative counts from the end)"),
         optBool("keepdim", false, "keep the dim with size 1")},
        S::Replicated, "mean over one dim", "x: [B, ..., n, ...] -> [B, ..., ...]")
      .infer = inferMean;
  t.add(OpKind::Select, "select",
        {x(), integer("dim", "the dim to index (negative counts from the end)"),
         integer("index", "the index kept (negative counts from the end)")},
        S::Replicated, "one index of a dim, the dim dropped",
        "x: [B, ..., n, ...] -> [B, ..., ...]")
      .infer = inferSelect;
  t.add(OpKind::Narrow, "narrow",
        {x(), integer("dim", "the dim to cut (negative counts from the end)"),
         integer("start", "the first index kept (negative counts from the end)"),
         integer("length", "how many indices are kept")},
        S::Replicated, "a run of indices of a dim, the dim kept",
        "x: [B, ..., n, ...] -> [B, ..., length, ...]")
      .infer = inferNarrow;
}

} // namespace epl::ir::ops
