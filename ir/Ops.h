// The op table: every op kind's one definition. Its entry holds the signature, what
// `split(n)` does to it, and its rules: the shape rule, the parameters, what its backward
// reads, the layout of its kernel call and the FLOPs of its matrix products. Each family's
// entries and rules are written together in ir/ops/ (one file per family), so all that is
// known of an op is found in one place; the functions below look the table up.
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
  BatchNorm,
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
  Mean,   // mean over one dim
  Select, // one index of a dim, the dim dropped
  Narrow, // a run of indices of a dim, the dim kept
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
  // An optional tensor (attention's `mask`) comes after the required ones: when a call
  // gives it, it is one more input and the attribute of its name is `true`; otherwise
  // neither (its defaultValue is `false`).
  bool required = true;
  Attr defaultValue = int64_t{0}; // when not required
  std::vector<std::string> words; // allowed values of a Word argument
  std::string doc;
  // When not required and not given: the value of this earlier argument instead of
  // defaultValue (attention's `kv_heads = heads`); "" for none.
  std::string defaultArg = "";
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

// How a parameter starts (interp/Init.h), as PyTorch's layers initialise themselves:
// Uniform ~ U(-1/sqrt(fanIn), 1/sqrt(fanIn)) (a weight and its bias alike), Normal N(0, 1),
// One and Zero constants.
enum class ParamInit { Uniform, Normal, One, Zero };

struct ParamSpec {
  std::string name; // suffix: weight, bias, qkv_weight…
  Shape shape;
  ParamInit init = ParamInit::Uniform;
  int64_t fanIn = 1; // the weight's input width, for Uniform
  double std = 1;    // the standard deviation, for Normal
  // false: state the forward keeps (batch_norm's running statistics), which no optimizer
  // updates; it has a gradient tensor, always zero.
  bool trainable = true;
};

// What an op's backward needs from its forward: the tensors the forward saves after its
// outputs (each family's file says what they hold), and whether it reads the op's inputs
// or output again. Autodiff keeps exactly these alive.
struct GradInfo {
  bool differentiable = true; // false: no backward at all (next, integer-only ops)
  bool needsInputs = false;   // backward reads the op's tensor inputs
  bool needsOutput = false;   // backward reads the op's output
  std::vector<TensorType> saved;
};

// Concrete sizes of a tensor, as a rank holds it.
using Sizes = std::vector<int64_t>;

// How a product's operands lie in memory (row-major), as the kernel passes them to its GEMM:
// A B^T (a layer's forward, x W^T with W [out, in]), A B, or A^T B (a weight gradient, a sum
// over the rows of both). Libraries reach different rates on each (`epl calibrate` times
// them apart).
enum class GemmLayout : uint8_t { ABt, AB, AtB };

// One matrix product of a kernel, `count` times: [m, k] by [k, n].
struct Product {
  double m = 0, n = 0, k = 0, count = 1;
  GemmLayout layout = GemmLayout::ABt;
  // Attention's per-head products (the scores and their product with V, and their
  // gradients), which EPL's kernels multiply in f32 under amp too (ClusterDevice::
  // headProductsF32).
  bool perHead = false;
  double flops() const { return 2 * m * n * k * count; } // a multiply-add counts 2
};
const char* gemmLayoutName(GemmLayout l); // "ABt", "AB", "AtB"

struct OpInfo {
  OpKind kind;
  std::string name;          // the builtin's name in scripts (`cross_entropy`)
  std::vector<ArgSpec> args; // tensors first
  SplitRule split = SplitRule::Replicated;
  bool builtin = true; // callable from scripts
  std::string summary; // one line for docs and hover
  std::string shapes;  // e.g. "x: [..., D] -> [..., out]"

  // The shape rule: output types from input types and attributes; on a mistake a message
  // for the user (lower case, no trailing period).
  using InferFn = std::string (*)(const OpInfo& op, const std::vector<TensorType>& in,
                                  const Attrs& attrs, std::vector<TensorType>& out);
  // Parameter shapes (layers only). With no inputs the widths read from them are 0: the
  // names and their count still hold.
  using ParamsFn = std::vector<ParamSpec> (*)(const std::vector<TensorType>& in,
                                              const Attrs& attrs);
  // The tensors the forward saves for the backward, `savedCount` of them.
  using SavedFn = std::vector<TensorType> (*)(const std::vector<TensorType>& in,
                                              const Attrs& attrs);
  // The forward's matrix products, from the sizes of the tensor inputs, the parameters
  // and the first output as one rank holds them, and the op's attributes.
  using ProductsFn = std::vector<Product> (*)(const std::vector<Sizes>& in,
                                              const std::vector<Sizes>& params, const Sizes& out,
                                              const Attrs& attrs);
  InferFn infer = nullptr;
  ParamsFn params = nullptr;
  SavedFn saved = nullptr;
  ProductsFn products = nullptr; // none: no matrix products (elementwise work is bytes-bound)
  bool differentiable = true, needsInputs = false, needsOutput = false; // see GradInfo
  int outputs = 1;         // the kernel's outputs before the saved tensors
  int savedCount = 0;      // the saved tensors
  int activationSaved = 0; // the first saved ones that are activation-sized (amp halves them)
  std::string cut;         // the attribute split(n) divides (`heads`, `out`…), "" none
  // A second attribute split(n) divides alike, which the width must divide too
  // (attention's `kv_heads`), "" none.
  std::string cutAlso;
  // The parameter a row-parallel form adds once, after the partial sums are reduced
  // (`bias` of a row linear or conv2d, `fc2_bias` of a split mlp, `proj_bias` of split
  // attention).
  std::string outputBias;
  // amp: its kernel multiplies by its weights, which it reads rounded to the half type
  // (linear, conv2d, mlp, attention, the experts); norms, embeddings and routers read
  // theirs as they are.
  bool castsWeights = false;
  // amp: its kernels (on every device) read and write half-precision tensors as they are
  // stored, converting each element as they go: the call makes no f32 copies
  // (backend/HalfStaging.h, Module::ampStagingBytes).
  bool halfAsStored = false;
  // amp: its forward writes its half-precision output (out[0]) itself, a block of rows at
  // a time (halfOutputRows) computed in f32 into its workspace and rounded: the output takes
  // no f32 copy of its whole size (linear, whose output can be a language model's logits).
  bool halfOutputByRows = false;

  // The op's tensor inputs: the required tensors, and the optional ones `attrs` say are
  // given (ArgSpec::required).
  int tensorInputs(const Attrs& attrs) const;
};

const OpInfo& opInfo(OpKind kind);
// The attribute `split(n)` divides for an op (`heads` of attention, `out` of a column
// linear, …), or "" when split cuts nothing of it.
std::string cutAttr(OpKind kind);
// The value an op's optional argument `arg` takes when `attrs` (the given ones) lack it:
// its default, or the argument its default names (ArgSpec::defaultArg).
Attr argDefault(const OpInfo& op, const ArgSpec& arg, const Attrs& attrs);
// Whether an op's optional tensor argument `name` is given (attention's `mask`).
bool givesTensor(const Attrs& attrs, const std::string& name);
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
GradInfo gradInfo(OpKind kind, const std::vector<TensorType>& in, const Attrs& attrs);
// The index among an op's parameters of its `outputBias`, or -1.
int outputBiasIndex(OpKind kind, const Attrs& attrs);

// The kernel call of an op (backend::KernelCall), one layout for every kind and device:
//   forward   in  = the tensor inputs, then the parameters
//             out = the outputs, then the saved tensors
//   backward  in  = the output's gradient, the tensor inputs, the parameters, the output,
//                   the saved tensors
//             out = a gradient per tensor input, then per parameter
// A tensor the backward does not read is passed with its shape and no data.
struct CallArity {
  size_t in = 0, out = 0;
};
CallArity callArity(OpKind kind, const Attrs& attrs, bool backward);

// Where attention's tensors sit in its call: the parameters Wqkv, bqkv, Wp, bp follow x and
// the mask, when given (forward: in = [x, mask, params], out = [y, qkv, ctx, lse];
// backward: in = [dy, x, mask, params, y, qkv, ctx, lse], out = [dx, dmask (never
// written), their gradients]). With `bias = false` the biases are absent (index -1), and
// without a mask the mask and its gradient, and the rest move up.
struct AttentionSlots {
  int mask;                   // input: integers [B, T], or -1
  int wqkv, bqkv, wp, bp;     // inputs
  int qkv, ctx, lse;          // backward inputs the forward saved
  int dwqkv, dbqkv, dwp, dbp; // backward outputs
};
AttentionSlots attentionSlots(const Attrs& attrs, bool backward);

// amp: the inputs of a call (bit i: in[i]) that its kernel reads only as operands of its
// matrix products (and of column sums): where the products take half precision as it is
// stored, these need no f32 copy (backend/HalfStaging.h, directInputs). Linear's, mlp's
// and attention's (its projections' operands, its saved context); 0 for the other kinds.
uint64_t productInputs(OpKind kind, const Attrs& attrs, bool backward);
// mlp's backward reads its saved h (in[7]) only through the activation, which its kernels
// widen a piece at a time where the products' inputs come as stored: bit 7, else 0.
uint64_t widenedInputs(OpKind kind, bool backward, size_t inputs);

// The matrix products of one run of an op on tensors of these sizes: its forward's, or its
// backward's, two for each forward product C = A B (the gradients of the input and of the
// weights): dA = dC B^T, [m, n] by [n, k], and dB = A^T dC, [k, m] by [m, n].
std::vector<Product> opProducts(OpKind kind, const std::vector<Sizes>& in,
                                const std::vector<Sizes>& params, const Sizes& out,
                                const Attrs& attrs, bool backward);
// Their FLOPs: the forward's, and the backward's, twice the forward's, as Megatron-LM's
// accounting has it.
struct Flops {
  double forward = 0, backward = 0;
};
Flops opFlops(OpKind kind, const std::vector<Sizes>& in, const std::vector<Sizes>& params,
              const Sizes& out, const Attrs& attrs);

int64_t intAttr(const Attrs& a, const std::string& key);

// cross_entropy's `ignore_index`: targets equal to it count nothing (PyTorch's -100 where
// the op was built without attributes).
constexpr int64_t kNoIgnoredClass = -100;
int64_t ignoredClass(const Attrs* a);
// How many of targets t[0, n) are not `ignored`.
int64_t keptTargets(const int32_t* t, int64_t n, int64_t ignored);

// conv2d runs im2col over groups of images: as many as keep one group's columns (C K K
// rows of Ho Wo each per image) within kConvColBudget floats, at least one, at most the
// batch. The kernels and the memory plan's workspace of a conv2d read this one rule. 4 MiB:
// the GEMM reads the columns im2col has just written from cache, where 16 MiB went out to
// memory and back (examples/cnn_fashion.epl on a 2-core EPYC VM, its step 37.7 -> 31 ms at 1
// thread, 19.5 -> 16.5 ms at 2; 1 MiB, 2 MiB and 8 MiB slower than 4).
constexpr int64_t kConvColBudget = int64_t{1} << 20; // 4 MiB
inline int64_t convGroup(int64_t ckk, int64_t plane, int64_t batch) {
  int64_t fit = kConvColBudget / std::max<int64_t>(ckk * plane, 1);
  return std::max<int64_t>(1, std::min(fit, batch));
}
// conv2d through oneDNN's direct convolution (the CPU device, backend/cpu/ConvDirect.cpp):
// the batch in groups of `images` images (at most kConvGroups groups), run in `lanes`
// lanes, each lane its groups in order on one thread, so that the workspace holds a lane's
// buffers `lanes` times whatever the thread count. With channels blocked as oneDNN lays them
// out (counted here padded to kConvChannelBlock, the widest an x86 CPU takes), a lane holds
// the group's images and outputs and the weights (for a last group whose primitive wants
// another layout); in the backward dy, dx, dx as NCHW (added where it accumulates), the
// weights' gradient blocked, then OIHW with the bias's after it, and the lane's sums of
// those. Once: the weights blocked. Lanes are as many as fit kConvLaneBudget floats, at most
// the groups; where fewer fit than min(groups, kConvMinLanes) (large images) the kernel runs
// im2col instead: one lane would leave the other cores idle. The kernel and the memory
// plan's workspace read this one rule.
constexpr int64_t kConvGroups = 16, kConvMinLanes = 4, kConvChannelBlock = 16;
constexpr int64_t kConvLaneBudget = int64_t{1} << 23; // 32 MiB
struct ConvDirectPlan {
  int64_t images, groups, lanes;
  int64_t in, out, weights, nchw, sums; // the floats of each buffer
  int64_t laneFloats;
  bool taken; // else im2col
  int64_t floats() const { return weights + lanes * laneFloats; }
};
inline ConvDirectPlan convDirectPlan(int64_t b, int64_t c, int64_t h, int64_t w, int64_t co,
                                     int64_t k, int64_t plane, bool backward) {
  auto padded = [](int64_t ch) {
    return (ch + kConvChannelBlock - 1) / kConvChannelBlock * kConvChannelBlock;
  };
  ConvDirectPlan d{};
  d.images = std::max<int64_t>(1, (b + kConvGroups - 1) / kConvGroups);
  d.groups = std::max<int64_t>(1, (b + d.images - 1) / d.images);
  d.in = d.images * padded(c) * h * w;
  d.out = d.images * padded(co) * plane;
  d.weights = padded(co) * padded(c) * k * k;
  d.nchw = d.images * c * h * w;
  d.sums = co * c * k * k + co;
  d.laneFloats = d.in + d.out + d.weights + (backward ? d.nchw + d.weights + 2 * d.sums : 0);
  d.lanes = std::clamp<int64_t>(kConvLaneBudget / std::max<int64_t>(d.laneFloats, 1), 1, d.groups);
  d.taken = d.lanes >= std::min(d.groups, kConvMinLanes);
  return d;
}
inline bool castsWeights(OpKind k) {
  return opInfo(k).castsWeights;
}
inline bool halfAsStored(OpKind k) {
  return opInfo(k).halfAsStored;
}
// The f32 floats a block of an op's half output takes at most (OpInfo::halfOutputByRows):
// 64 MiB, a GPT-2 head's 333 rows of 50,257 logits.
constexpr int64_t kHalfOutputFloats = int64_t{1} << 24;
// The rows of a block of such an output of `rows` rows of `cols` values, at least one. The
// kernels and the memory plan's workspace read this one rule.
inline int64_t halfOutputRows(int64_t rows, int64_t cols) {
  int64_t fit = kHalfOutputFloats / std::max<int64_t>(cols, 1);
  return std::max<int64_t>(1, std::min(fit, rows));
}
double floatAttr(const Attrs& a, const std::string& key);
std::string attrStr(const Attr& a);

} // namespace epl::ir
