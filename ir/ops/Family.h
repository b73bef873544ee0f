// What the op families share while they define their ops (ir/ops/*.cpp): argument
// builders, the checks their shape rules make, and the table they add their entries to.
// Internal to the op table (ir/Ops.cpp).
//
// Shape legend: B batch, T time, D width, H heads, V vocab, C channels, E experts,
// F hidden width, K kernel.
#pragma once
#include "ir/Ops.h"

#include <optional>
#include <string>
#include <vector>

namespace epl::ir::ops {

// Arguments of a signature.
ArgSpec tensor(std::string name, std::string doc);
ArgSpec x(); // the usual first input
// An optional tensor, after the required arguments (ArgSpec::required says how a call
// that gives it differs).
ArgSpec optTensor(std::string name, std::string doc);
ArgSpec integer(std::string name, std::string doc);
ArgSpec optInt(std::string name, int64_t def, std::string doc);
// An optional integer whose default is the value of the earlier argument `from`.
ArgSpec optIntFrom(std::string name, std::string from, std::string doc);
ArgSpec optFloat(std::string name, double def, std::string doc);
ArgSpec optBool(std::string name, bool def, std::string doc);
ArgSpec optWord(std::string name, std::string def, std::vector<std::string> words, std::string doc);
// An optional name (a word or a string, any value): left out, the op has no attribute of
// that name.
ArgSpec optName(std::string name, std::string doc);

// The table as the families fill it: one entry per kind, in any order.
class Table {
public:
  Table();
  // A new entry; the family sets its rules on the returned entry.
  OpInfo& add(OpKind kind, std::string name, std::vector<ArgSpec> args, SplitRule split,
              std::string summary, std::string shapes, bool builtin = true);
  std::vector<OpInfo> finish(); // every kind defined, in the order of OpKind

private:
  std::vector<OpInfo> entries_;
  std::vector<bool> defined_;
};

void addDense(Table& t);       // linear, mlp
void addLookups(Table& t);     // embedding, positions
void addNorms(Table& t);       // layer_norm, rms_norm
void addAttention(Table& t);   // attention
void addMoe(Table& t);         // moe and the four ops a call becomes
void addImage(Table& t);       // conv2d, max_pool, avg_pool
void addPointwise(Table& t);   // activations, dropout, softmax, arithmetic
void addShapes(Table& t);      // flatten, reshape, transpose, next
void addSlicing(Table& t);     // mean, select, narrow
void addLosses(Table& t);      // cross_entropy, mse
void addCollectives(Table& t); // the communication passes insert
void addTraining(Table& t);    // grad_norm, optimizer_step

// Shape-rule checks: "" when it holds, else the user's message naming the op.
std::string tensorStr(const TensorType& t); // `f32[B, 8]`
std::string knownLast(const std::string& op, const TensorType& t, int64_t& v);
std::string needFloat(const std::string& op, const TensorType& t);
std::string positive(const std::string& op, const std::string& arg, int64_t v);
// The product of dims, or nullopt when its constant passes 2^63 - 1.
std::optional<Dim> product(const Shape& dims);

// The shape rule of a row-wise op (norms, softmax): a float input of known width, kept.
OpInfo::InferFn rowWiseRule();
// The saved tensor of mlp and moe's experts: h f32[..., F], each row's first linear
// before the activation (F the `hidden` attribute).
std::vector<TensorType> hiddenSaved(const std::vector<TensorType>& in, const Attrs& attrs);
// The shape rule of an op whose output is its first input's type.
std::string sameAsInput(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                        std::vector<TensorType>& out);

inline Dim constant(int64_t v) {
  return Dim::constant(v);
}
inline Shape allButLast(const Shape& s) {
  return Shape(s.begin(), s.end() - (s.empty() ? 0 : 1));
}
inline TensorType f32(Shape s) {
  return TensorType{DType::F32, std::move(s)};
}
// The last input dim, 0 without inputs (a parameter list read for its names alone).
inline int64_t lastWidth(const std::vector<TensorType>& in) {
  return in.empty() || in[0].shape.empty() ? 0 : in[0].shape.back().coef;
}
// Rows of concrete sizes: every dim but the last.
inline double rowsOf(const Sizes& s) {
  double r = 1;
  for (size_t k = 0; k + 1 < s.size(); ++k)
    r *= static_cast<double>(s[k]);
  return r;
}
inline double widthOf(const Sizes& s) {
  return s.empty() ? 1 : static_cast<double>(s.back());
}

} // namespace epl::ir::ops
