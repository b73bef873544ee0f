// conv2d, max_pool and avg_pool: windows over images x [B, C, H, W].
#include "ir/ops/Family.h"

#include "support/Checked.h"

#include <fmt/format.h>

namespace epl::ir::ops {

namespace {

// The output side of a window: (n + 2 x pad - k) / stride + 1. nullopt when the kernel does
// not fit; `tooLarge` when n + 2 x pad passes 2^63 - 1.
std::optional<int64_t> windowOutput(int64_t n, int64_t k, int64_t stride, int64_t pad,
                                    bool& tooLarge) {
  std::optional<int64_t> padded = checkedMul(pad, 2);
  if (padded) padded = checkedAdd(n, *padded);
  tooLarge = !padded;
  if (!padded || *padded < k) return std::nullopt;
  return (*padded - k) / stride + 1;
}

std::string inferImage(const std::string& op, const TensorType& x, int64_t outC, int64_t k,
                       int64_t stride, int64_t pad, std::vector<TensorType>& out) {
  if (x.shape.size() != 4)
    return fmt::format("`{}` needs a [B, C, H, W] input, got {}", op, tensorStr(x));
  if (!x.shape[2].isConstant() || !x.shape[3].isConstant())
    return fmt::format("`{}` needs known height and width, got {}", op, tensorStr(x));
  Shape s = x.shape;
  for (int i : {2, 3}) {
    bool tooLarge = false;
    std::optional<int64_t> v = windowOutput(x.shape[i].coef, k, stride, pad, tooLarge);
    if (tooLarge)
      return fmt::format("`{}` padding {} makes the input too large: more than 2^63 - 1", op, pad);
    if (!v)
      return fmt::format("`{}` kernel {} does not fit the {}x{} input of {}", op, k,
                         x.shape[2].coef, x.shape[3].coef, tensorStr(x));
    s[i] = constant(*v);
  }
  if (outC > 0) s[1] = constant(outC);
  out.push_back(TensorType{x.dtype, s});
  return "";
}

std::string inferConv(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                      std::vector<TensorType>& out) {
  int64_t c = intAttr(attrs, "channels"), k = intAttr(attrs, "kernel");
  int64_t st = intAttr(attrs, "stride"), pad = intAttr(attrs, "padding");
  std::string err;
  if (!(err = positive(op.name, "channels", c)).empty() ||
      !(err = positive(op.name, "kernel", k)).empty() ||
      !(err = positive(op.name, "stride", st)).empty())
    return err;
  if (pad < 0) return "`conv2d` padding must not be negative";
  if (in[0].shape.size() == 4 && !in[0].shape[1].isConstant())
    return fmt::format("`conv2d` needs known input channels, got {}", tensorStr(in[0]));
  return inferImage(op.name, in[0], c, k, st, pad, out);
}

std::vector<ParamSpec> convParams(const std::vector<TensorType>& in, const Attrs& attrs) {
  int64_t ch = intAttr(attrs, "channels"), k = intAttr(attrs, "kernel");
  int64_t inC = in.empty() ? 0 : in[0].shape[1].coef;
  int64_t fanIn = inC * k * k;
  std::vector<ParamSpec> p{{"weight",
                            {constant(ch), constant(inC), constant(k), constant(k)},
                            ParamInit::Uniform,
                            fanIn}};
  if (std::get<bool>(attrs.at("bias")))
    p.push_back({"bias", {constant(ch)}, ParamInit::Uniform, fanIn});
  return p;
}

// For each group of G images (convGroup), the kernels by the group's im2col columns:
// [Co, C K K] by [C K K, G Ho Wo]; w [Co, C, K, K], out [B, Co, Ho, Wo].
std::vector<Product> convProducts(const std::vector<Sizes>&, const std::vector<Sizes>& params,
                                  const Sizes& out, const Attrs&) {
  const Sizes& w = params[0];
  int64_t ckk = w[1] * w[2] * w[3], plane = out[2] * out[3];
  double group = static_cast<double>(convGroup(ckk, plane, out[0]));
  return {{static_cast<double>(w[0]), group * static_cast<double>(plane), static_cast<double>(ckk),
           static_cast<double>(out[0]) / group, GemmLayout::AB}};
}

std::string inferPool(const OpInfo& op, const std::vector<TensorType>& in, const Attrs& attrs,
                      std::vector<TensorType>& out) {
  int64_t k = intAttr(attrs, "kernel"), st = intAttr(attrs, "stride");
  std::string err;
  if (!(err = positive(op.name, "kernel", k)).empty()) return err;
  if (st < 0) return fmt::format("`{}` stride must not be negative", op.name);
  return inferImage(op.name, in[0], 0, k, st == 0 ? k : st, 0, out);
}

// Saved by max_pool: argmax i32[B, C, H', W'], the flat index of each window's maximum in
// its input's H x W plane.
std::vector<TensorType> maxPoolSaved(const std::vector<TensorType>& in, const Attrs& attrs) {
  std::vector<TensorType> out;
  inferPool(opInfo(OpKind::MaxPool), in, attrs, out);
  return {TensorType{DType::I32, out.at(0).shape}};
}

} // namespace

void addImage(Table& t) {
  OpInfo& conv =
      t.add(OpKind::Conv2d, "conv2d",
            {x(), integer("channels", "output channels"), integer("kernel", "square kernel size K"),
             optInt("stride", 1, "step"), optInt("padding", 0, "zeros on each side"),
             optBool("bias", true, "add a bias")},
            SplitRule::Channels, "2-d convolution", "x: [B, C, H, W] -> [B, channels, H', W']");
  conv.infer = inferConv;
  conv.params = convParams;
  conv.products = convProducts;
  conv.needsInputs = true;
  conv.cut = "channels";
  conv.outputBias = "bias"; // row-parallel over cut input channels
  conv.castsWeights = true;

  OpInfo& maxPool =
      t.add(OpKind::MaxPool, "max_pool",
            {x(), integer("kernel", "window K"), optInt("stride", 0, "step; 0 means the kernel")},
            SplitRule::Elementwise, "2-d max pooling", "x: [B, C, H, W] -> [B, C, H', W']");
  maxPool.infer = inferPool;
  maxPool.saved = maxPoolSaved;
  maxPool.savedCount = 1;

  OpInfo& avgPool =
      t.add(OpKind::AvgPool, "avg_pool",
            {x(), integer("kernel", "window K"), optInt("stride", 0, "step; 0 means the kernel")},
            SplitRule::Elementwise, "2-d average pooling", "x: [B, C, H, W] -> [B, C, H', W']");
  avgPool.infer = inferPool;
}

} // namespace epl::ir::ops
