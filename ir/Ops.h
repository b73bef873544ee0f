// The op table: every builtin layer and op with its signature, shape rule, parameters and
// what `split(n)` does to it; plus the communication ops that passes insert.
#pragma once
#include "ir/Types.h"

#include <algorithm>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace epl::ir {

enum class OpKind {
  // Layers with parameters.
  Linear,
  Embedding,
  Positions,
  LayerNorm,
  RmsNorm,
  Attention,
  Mlp,
  Moe, // the builtin; a call becomes the four ops below (frontend, emitMoe)
  Conv2d,
  // Parameter-free ops.
  Gelu,
  Relu,
  Silu,
  Tanh,
  Sigmoid,
  Softmax,
  Dropout,
  MaxPool,
  AvgPool,
  Add,
  Sub,
  Mul,
  Scale,
  Flatten,
  Reshape,
  Transpose,
  Next,
  // A `moe` call, in the order they run (docs/language.md, "moe"): the router's softmax
  // gates; each token's top-k experts under the capacity, its copies grouped by expert;
  // each expert's mlp over its rows; the rows weighted back into their tokens.
  MoeRouter,
  MoeDispatch,
  MoeExperts,
  MoeCombine,
  // Losses.
  CrossEntropy,
  Mse,
  // Communication, inserted by passes (never written by users).
  AllGather,
  AllReduce,
  ReduceScatter, // partial sums in, this device's piece of their sum out
  AllToAll,
  Slice,
  SendRecv,
  Identity, // a whole tensor entering a split op: its backward all-reduces the gradient
  // Training, inserted by autodiff.
  GradNorm,      // the global L2 norm of every parameter gradient
  OptimizerStep, // one parameter's update from its gradient
};

using Attr = std::variant<int64_t, double, bool, std::string, Shape>;
using Attrs = std::map<std::string, Attr>;

enum class ArgKind { Tensor, Int, Float, Bool, Word, Dims };

struct ArgSpec {
  std::string name;
  ArgKind kind = ArgKind::Tensor;
  bool required = true;
  Attr defaultValue = int64_t{0}; // when not required
  std::vector<std::string> words; // allowed values of a Word argument
  std::string doc;
};

// What split(n) does to an op (docs/language.md, "split").
enum class SplitRule {
  Replicated,  // every device computes it whole (positions, reshapes)
  RowWise,     // works on the last dim of each row: any layout but a cut last dim
  Elementwise, // follows its input's layout
  Linear,      // column-parallel on a whole input, row-parallel on a last-dim shard
  Heads,       // attention heads divided
  Hidden,      // mlp hidden width divided, output all-reduced
  Vocab,       // embedding rows or loss vocabulary divided
  Experts,     // moe experts divided, tokens moved by all-to-all (moe_experts)
  Tokens,      // moe's router, dispatch and combine: each device its own tokens
  Channels,    // conv2d output channels divided
  Communication,
};

struct ParamSpec {
  std::string name; // suffix: weight, bias, qkv_weight…
  Shape shape;
};

struct OpInfo {
  OpKind kind;
  std::string name;          // the builtin's name in scripts (`cross_entropy`)
  std::vector<ArgSpec> args; // tensors first
  SplitRule split = SplitRule::Replicated;
  bool builtin = true; // callable from scripts
  std::string summary; // one line for docs and hover
  std::string shapes;  // e.g. "x: [..., D] -> [..., out]"
  int tensorArgs() const;
};

const OpInfo& opInfo(OpKind kind);
// The attribute `split(n)` divides for an op (`heads` of attention, `out` of a column
// linear, …), or "" when split cuts nothing of it.
std::string cutAttr(OpKind kind);
// The builtin a script's call wrote for an op of this kind: `moe` for its four ops, else
// the kind itself.
OpKind builtinOf(OpKind kind);
// The builtin with this script name, or nullptr.
const OpInfo* findBuiltin(const std::string& name);
const std::vector<OpInfo>& allOps();

// Output types of an op from its input types and attributes. On a mistake returns a message
// for the user (lower case, no trailing period) and leaves `out` empty.
std::string inferTypes(OpKind kind, const std::vector<TensorType>& in, const Attrs& attrs,
                       std::vector<TensorType>& out);
// Parameter shapes of a layer (empty for parameter-free ops). Inputs must be typed already.
std::vector<ParamSpec> paramSpecs(OpKind kind, const std::vector<TensorType>& in,
                                  const Attrs& attrs);

int64_t intAttr(const Attrs& a, const std::string& key);

// conv2d runs im2col over groups of images: as many as keep one group's columns (C K K
// rows of Ho Wo each per image) within kConvColBudget floats, at least one, at most the
// batch. The kernels and the memory plan's workspace of a conv2d read this one rule.
constexpr int64_t kConvColBudget = int64_t{1} << 22; // 16 MiB
inline int64_t convGroup(int64_t ckk, int64_t plane, int64_t batch) {
  int64_t fit = kConvColBudget / std::max<int64_t>(ckk * plane, 1);
  return std::max<int64_t>(1, std::min(fit, batch));
}
// amp: the ops whose kernels multiply by their weights, which they read rounded to the half
// type (linear, conv2d, mlp, attention, the experts); norms, embeddings and routers read
// theirs as they are.
inline bool castsWeights(OpKind k) {
  return k == OpKind::Linear || k == OpKind::Conv2d || k == OpKind::Mlp || k == OpKind::Attention ||
         k == OpKind::MoeExperts;
}
double floatAttr(const Attrs& a, const std::string& key);
std::string attrStr(const Attr& a);

} // namespace epl::ir
