// Runs one kernel case through a device (the CPU, or with "device": "cuda" the GPU) for the
// PyTorch oracle tests (test_ops.py).
//
// Reads a JSON case (argv[1]) naming an op, its attributes, its tensor inputs and params as
// raw little-endian files, then runs the forward and the backward through
// makeDevice(device)->launch with the argument layout of backend/Device.h, and writes every
// result as a raw file into the case's "out_dir": out.bin (output 0), out<i>.bin (the other
// outputs of an op with several, as moe_dispatch's counts and stats), saved<i>.bin,
// grad<i>.bin. The op is a builtin or an internal op (moe_router, …) by its name.
// The backward gets what the executor passes it: the gradient of output 0 only, and inputs
// and output 0 the backward must not read (ir::gradInfo) with null data, so a kernel that
// reads them crashes here. Optional keys: "sample_weight" (KernelCall::sampleWeight),
// "param_pieces" (the params are a split rank's pieces, as the experts of a split
// moe_experts: their shapes come from the case, not from the op table), "saved_shapes" (the
// saved tensors' shapes where the pieces change them, as a split attention's), "vocab_first"
// (the embedding table is the vocabulary slice from that row: KernelCall::vocabSlice), "cut"
// ([piece, pieces, index]: the input is that piece of every row of a tensor cut over a split
// group, KernelCall::cutPiece, as a dropout in a split region gets). With "repeat", the
// case runs again, and once more on one thread, and must give identical bits each time. Other
// modes test the optimizer ("mode": "optimizer") and sumSquares/scale ("mode": "reduce"), or
// only make the device ("mode": "device"; as in every mode, exit 77 where it cannot be made).
// "matmul": "tf32" makes the device with TF32 products (policy `matmul`; the CPU ignores it).
#include "backend/Device.h"
#include "ir/Ops.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace {

using epl::backend::Device;
using epl::backend::TensorView;
using nlohmann::json;
namespace ir = epl::ir;

[[noreturn]] void fail(const std::string& msg) {
  std::cerr << "kernel probe: " << msg << "\n";
  std::exit(2);
}

std::vector<char> readFile(const std::string& path, int64_t bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read " + path);
  std::vector<char> buf(static_cast<size_t>(bytes));
  f.read(buf.data(), bytes);
  if (f.gcount() != bytes) fail(path + " is shorter than its shape");
  return buf;
}

void writeFile(const std::string& path, const void* data, int64_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), bytes);
  if (!f) fail("cannot write " + path);
}

// A device tensor that frees itself.
struct Tensor {
  Device* dev = nullptr;
  TensorView view;
  Tensor(Device* d, ir::DType t, std::vector<int64_t> shape) : dev(d) {
    view.dtype = t;
    view.shape = std::move(shape);
    view.data = dev->allocate(view.bytes());
    dev->fillZero(view.data, view.bytes());
  }
  Tensor(const Tensor&) = delete;
  ~Tensor() { dev->release(view.data); }
  void load(const std::string& path) {
    auto buf = readFile(path, view.bytes());
    dev->copyToDevice(view.data, buf.data(), view.bytes());
  }
  std::vector<char> host() const {
    std::vector<char> buf(static_cast<size_t>(view.bytes()));
    dev->copyToHost(buf.data(), view.data, view.bytes());
    dev->synchronize();
    return buf;
  }
  void save(const std::string& path) const {
    auto buf = host();
    writeFile(path, buf.data(), view.bytes());
  }
  TensorView nullView() const { return TensorView{nullptr, view.dtype, view.shape}; }
};
using TensorPtr = std::unique_ptr<Tensor>;

std::vector<int64_t> concreteShape(const ir::Shape& s) {
  std::vector<int64_t> out;
  for (const auto& d : s) {
    if (!d.isConstant()) fail("symbolic dim in a probe case");
    out.push_back(d.coef);
  }
  return out;
}

ir::Shape irShape(const json& j) {
  ir::Shape s;
  for (int64_t v : j)
    s.push_back(ir::Dim::constant(v));
  return s;
}

ir::Attr toAttr(const ir::ArgSpec& spec, const json& v) {
  switch (spec.kind) {
  case ir::ArgKind::Int:
    return v.get<int64_t>();
  case ir::ArgKind::Float:
    return v.get<double>();
  case ir::ArgKind::Bool:
    return v.get<bool>();
  case ir::ArgKind::Word:
    return v.get<std::string>();
  case ir::ArgKind::Dims:
    return irShape(v);
  case ir::ArgKind::Tensor:
    break;
  }
  fail("attribute " + spec.name + " is a tensor");
}

ir::Attrs buildAttrs(const ir::OpInfo& op, const json& j) {
  ir::Attrs a;
  for (const auto& spec : op.args) {
    if (spec.kind == ir::ArgKind::Tensor) { // an optional one given: `"mask": true`
      if (!spec.required && j.value(spec.name, false)) a[spec.name] = true;
      continue;
    }
    if (j.contains(spec.name))
      a[spec.name] = toAttr(spec, j.at(spec.name));
    else if (!spec.required)
      a[spec.name] = ir::argDefault(op, spec, a);
    else
      fail("missing attribute " + spec.name);
  }
  return a;
}

ir::DType dtypeOf(const json& t) {
  return t.value("dtype", "f32") == "i32" ? ir::DType::I32 : ir::DType::F32;
}

// A builtin by its script name, else an internal op (the parts of a moe call).
const ir::OpInfo* findOp(const std::string& name) {
  if (const ir::OpInfo* op = ir::findBuiltin(name)) return op;
  for (const auto& op : ir::allOps())
    if (op.name == name) return &op;
  return nullptr;
}

struct Case {
  const ir::OpInfo* op = nullptr;
  ir::Attrs attrs;
  std::vector<ir::TensorType> inTypes, outTypes;
  std::vector<ir::ParamSpec> params;
  ir::GradInfo grad;
};

Case describe(const json& j) {
  Case c;
  c.op = findOp(j.at("op").get<std::string>());
  if (!c.op) fail("unknown op " + j.at("op").get<std::string>());
  c.attrs = buildAttrs(*c.op, j.value("attrs", json::object()));
  for (const auto& t : j.at("inputs"))
    c.inTypes.push_back(ir::TensorType{dtypeOf(t), irShape(t.at("shape"))});
  std::string err = ir::inferTypes(c.op->kind, c.inTypes, c.attrs, c.outTypes);
  if (!err.empty()) fail("shape rule: " + err);
  c.params = ir::paramSpecs(c.op->kind, c.inTypes, c.attrs);
  c.grad = ir::gradInfo(c.op->kind, c.inTypes, c.attrs);
  if (j.at("params").size() != c.params.size()) fail("wrong number of params for the op");
  return c;
}

// One run of forward and backward; returns every result's bytes in a fixed order.
std::vector<std::vector<char>> runCase(Device& dev, const json& j, const Case& c, bool write) {
  const std::string dir = j.at("out_dir");
  std::vector<TensorPtr> inputs, params, outs, grads;
  for (size_t i = 0; i < c.inTypes.size(); ++i) {
    inputs.push_back(
        std::make_unique<Tensor>(&dev, c.inTypes[i].dtype, concreteShape(c.inTypes[i].shape)));
    inputs.back()->load(j["inputs"][i].at("path"));
  }
  const bool pieces = j.value("param_pieces", false);
  for (size_t i = 0; i < c.params.size(); ++i) {
    std::vector<int64_t> given = j["params"][i].at("shape"),
                         table = concreteShape(c.params[i].shape);
    if (!pieces && given != table)
      fail("param " + c.params[i].name + " has another shape in the op table");
    params.push_back(std::make_unique<Tensor>(&dev, ir::DType::F32, pieces ? given : table));
    params.back()->load(j["params"][i].at("path"));
  }
  // Forward out = [the op's outputs, the saved tensors].
  for (const auto& t : c.outTypes)
    outs.push_back(std::make_unique<Tensor>(&dev, t.dtype, concreteShape(t.shape)));
  const json savedShapes = j.value("saved_shapes", json::array());
  for (size_t i = 0; i < c.grad.saved.size(); ++i) {
    const auto& s = c.grad.saved[i];
    outs.push_back(std::make_unique<Tensor>(&dev, s.dtype,
                                            i < savedShapes.size()
                                                ? savedShapes[i].get<std::vector<int64_t>>()
                                                : concreteShape(s.shape)));
  }

  epl::backend::KernelCall fwd;
  fwd.kind = c.op->kind;
  fwd.attrs = &c.attrs;
  fwd.training = j.value("training", true);
  fwd.seed = j.value("seed", uint64_t{0});
  if (j.contains("vocab_first")) {
    fwd.vocabSlice = true;
    fwd.vocabFirst = j.at("vocab_first").get<int64_t>();
  }
  if (j.contains("cut")) {
    fwd.cutPiece = j.at("cut").at(0).get<int64_t>();
    fwd.cutPieces = j.at("cut").at(1).get<int>();
    fwd.cutIndex = j.at("cut").at(2).get<int>();
  }
  for (auto& t : inputs)
    fwd.in.push_back(t->view);
  for (auto& t : params)
    fwd.in.push_back(t->view);
  for (auto& t : outs)
    fwd.out.push_back(t->view);
  dev.launch(fwd);

  std::vector<std::vector<char>> results;
  auto keep = [&](const Tensor& t, const std::string& name) {
    results.push_back(t.host());
    if (write) t.save(dir + "/" + name);
  };
  const size_t nOut = c.outTypes.size();
  keep(*outs[0], "out.bin");
  for (size_t i = 1; i < outs.size(); ++i)
    keep(*outs[i], i < nOut ? "out" + std::to_string(i) + ".bin"
                            : "saved" + std::to_string(i - nOut) + ".bin");
  if (!j.value("backward", true) || !c.grad.differentiable) return results;

  // Backward: in = [dy, inputs, params, output 0, saved], out = [grad inputs, grad params];
  // the other outputs (moe_dispatch's counts and stats) take no gradient and are not passed.
  Tensor dy(&dev, c.outTypes[0].dtype, concreteShape(c.outTypes[0].shape));
  dy.load(j.at("dy"));
  epl::backend::KernelCall bwd = fwd;
  bwd.backward = true;
  bwd.sampleWeight = j.value("sample_weight", 0.f); // set on backward calls, as the executor does
  bwd.in = {dy.view};
  for (auto& t : inputs)
    bwd.in.push_back(c.grad.needsInputs ? t->view : t->nullView());
  for (auto& t : params)
    bwd.in.push_back(t->view);
  bwd.in.push_back(c.grad.needsOutput ? outs[0]->view : outs[0]->nullView());
  for (size_t i = nOut; i < outs.size(); ++i)
    bwd.in.push_back(outs[i]->view);
  bwd.out.clear();
  const json want = j.value("want", json::array()), acc = j.value("accumulate", json::array());
  std::vector<Tensor*> all;
  for (auto& t : inputs)
    all.push_back(t.get());
  for (auto& t : params)
    all.push_back(t.get());
  for (size_t i = 0; i < all.size(); ++i) {
    grads.push_back(std::make_unique<Tensor>(&dev, ir::DType::F32, all[i]->view.shape));
    bool wanted = all[i]->view.dtype == ir::DType::F32 && (i >= want.size() || want[i]);
    bool accumulate = i < acc.size() && acc[i].get<bool>();
    if (accumulate) grads.back()->load(j.at("acc_init")[i]);
    bwd.out.push_back(wanted ? grads.back()->view : grads.back()->nullView());
    bwd.accumulate.push_back(accumulate);
  }
  dev.launch(bwd);
  for (size_t i = 0; i < grads.size(); ++i)
    keep(*grads[i], "grad" + std::to_string(i) + ".bin");
  return results;
}

epl::backend::OptimizerKind optimizerKind(const std::string& s) {
  using K = epl::backend::OptimizerKind;
  if (s == "sgd") return K::Sgd;
  if (s == "adam") return K::Adam;
  if (s == "adamw") return K::AdamW;
  fail("unknown optimizer " + s);
}

// Several optimizer steps of one parameter: grads[i] is the raw gradient of step i + 1.
void runOptimizer(Device& dev, const json& j) {
  const std::vector<int64_t> shape = j.at("shape");
  Tensor p(&dev, ir::DType::F32, shape), g(&dev, ir::DType::F32, shape),
      s1(&dev, ir::DType::F32, shape), s2(&dev, ir::DType::F32, shape);
  p.load(j.at("param"));
  epl::backend::OptimizerCall call;
  call.kind = optimizerKind(j.at("kind"));
  call.lr = j.at("lr");
  call.beta1 = j.value("beta1", 0.9f);
  call.beta2 = j.value("beta2", 0.999f);
  call.eps = j.value("eps", 1e-8f);
  call.weightDecay = j.value("weight_decay", 0.f);
  call.momentum = j.value("momentum", 0.f);
  call.gradScale = j.value("grad_scale", 1.f);
  call.param = p.view;
  call.grad = g.view;
  bool noBuffer = call.kind == epl::backend::OptimizerKind::Sgd && call.momentum == 0.f;
  call.state1 = noBuffer ? s1.nullView() : s1.view;
  call.state2 = s2.view;
  int64_t step = 0;
  for (const auto& path : j.at("grads")) {
    g.load(path);
    call.step = ++step;
    dev.optimizerStep(call);
  }
  const std::string dir = j.at("out_dir");
  p.save(dir + "/param.bin");
  s1.save(dir + "/state1.bin");
  s2.save(dir + "/state2.bin");
}

// sumSquares of x (plain, then accumulated onto `init`), then x scaled in place.
void runReduce(Device& dev, const json& j) {
  const std::vector<int64_t> shape = j.at("shape");
  Tensor x(&dev, ir::DType::F32, shape), r(&dev, ir::DType::F32, {2});
  x.load(j.at("x"));
  float init = j.at("init");
  dev.copyToDevice(r.view.f32() + 1, &init, 4);
  dev.sumSquares(x.view, r.view.f32(), false);
  dev.sumSquares(x.view, r.view.f32() + 1, true);
  dev.scale(x.view, j.at("factor").get<float>());
  const std::string dir = j.at("out_dir");
  r.save(dir + "/sumsq.bin");
  x.save(dir + "/scaled.bin");
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) fail("usage: epl_kernel_probe CASE.json");
  std::ifstream f(argv[1]);
  if (!f) fail(std::string("cannot read ") + argv[1]);
  json j = json::parse(f);
  // "device": "cuda" runs the case on the GPU (test_ops.py --device cuda).
  const std::string device = j.value("device", "cpu");
  std::unique_ptr<Device> dev;
  try {
    epl::backend::DeviceOptions options;
    options.threads = j.value("threads", 0);
    // "matmul": "tf32" (policy `matmul`): a GPU's fp32 products on tensor cores.
    options.matmul = j.value("matmul", "fp32") == "tf32" ? ir::Matmul::Tf32 : ir::Matmul::Fp32;
    dev = epl::backend::makeDevice(device, options);
  } catch (const epl::backend::DeviceUnavailable& e) {
    std::cerr << "kernel probe: " << e.what() << "\n";
    return 77; // test_ops.py skips the family
  }
  std::string mode = j.value("mode", "op");
  if (mode == "device") return 0; // only whether the device can be made
  if (mode == "optimizer") {
    runOptimizer(*dev, j);
    return 0;
  }
  if (mode == "reduce") {
    runReduce(*dev, j);
    return 0;
  }
  Case c = describe(j);
  auto first = runCase(*dev, j, c, true);
  for (int r = 1; r < j.value("repeat", 1); ++r)
    if (runCase(*dev, j, c, false) != first) fail("results differ between identical runs");
  if (device == "cpu" && j.value("repeat", 1) > 1 && j.value("threads", 0) != 1) {
    // The same bits on one thread: no kernel's result may depend on the thread count.
    auto serial = epl::backend::makeCpuDevice(1);
    if (runCase(*serial, j, c, false) != first) fail("results differ on one thread");
  }
  return 0;
}
