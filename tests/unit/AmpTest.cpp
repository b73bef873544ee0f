// amp: which tensors a plan stores in half precision, the CPU device's half-precision calls
// (f32 arithmetic on rounded operands), and fp16's dynamic loss scale skipping a step whose
// gradients overflow.
#include "Planned.h"
#include "backend/Device.h"
#include "backend/comm/Comm.h"
#include "backend/comm/Wire.h"
#include "interp/Executor.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <fmt/format.h>

namespace {

using epl::ir::DType;

const char* kGpt = R"(
model lm(tokens: i32[B, 16]) {
  h = embedding(tokens, 32, 64)
  x = h + attention(layer_norm(h), 2)
  return cross_entropy(linear(layer_norm(x), 32), next(tokens))
}
policy { %s }
train lm {
  data = synthetic(samples = 64, classes = 32)
  batch = 8
  optimizer = adamw(lr = 1e-3)
}
)";

std::optional<epl::ir::Module> planAmp(const std::string& policy, int np = 1) {
  std::string text = kGpt;
  text.replace(text.find("%s"), 2, policy);
  return epl::testing::planned("amp.epl", text, np);
}

int opOf(const epl::ir::Module& m, epl::ir::OpKind kind) {
  for (size_t i = 0; i < m.ops.size(); ++i)
    if (m.ops[i].kind == kind && m.ops[i].phase == epl::ir::Phase::Forward)
      return static_cast<int>(i);
  FAIL("no such op");
  return -1;
}

} // namespace

TEST_CASE("amp stores activations and their gradients in half precision, the rest in f32") {
  auto m = planAmp("amp = bf16");
  REQUIRE(m);
  REQUIRE(m->ampApplies());
  const auto& ops = m->ops;
  const epl::ir::Op& att = ops[opOf(*m, epl::ir::OpKind::Attention)];
  CHECK(m->storedDtype(att.outputs[0]) == DType::BF16);
  CHECK(m->storedDtype(att.outputs[1]) == DType::BF16); // saved qkv
  CHECK(m->storedDtype(att.outputs[3]) == DType::F32);  // saved log-sum-exp
  const epl::ir::Op& norm = ops[opOf(*m, epl::ir::OpKind::LayerNorm)];
  CHECK(m->storedDtype(norm.outputs[0]) == DType::BF16);
  CHECK(m->storedDtype(norm.outputs[1]) == DType::F32); // mean
  CHECK(m->storedDtype(m->outputs[0]) == DType::F32);   // the loss
  CHECK(m->storedDtype(m->lossGrad) == DType::F32);
  CHECK(m->storedDtype(m->inputs[0]) == DType::I32);
  for (const epl::ir::Param& p : m->params)
    CHECK(m->storedDtype(p.grad) == DType::F32);
  // Every backward op writes the gradient of a half activation in half.
  int halfGrads = 0;
  for (const epl::ir::Op& op : ops)
    if (op.phase == epl::ir::Phase::Backward)
      for (size_t k = 0; k < ops[op.forward].inputs.size(); ++k)
        if (op.outputs[k] >= 0) {
          CHECK(m->storedDtype(op.outputs[k]) == m->storedDtype(ops[op.forward].inputs[k]));
          halfGrads += m->storedDtype(op.outputs[k]) == DType::BF16;
        }
  CHECK(halfGrads > 0);
  // The activations in the arena take about half the bytes (the same tensors, planned
  // alike); model states do not change.
  auto f32 = planAmp("amp = none");
  REQUIRE(f32);
  REQUIRE(f32->tensors.size() == m->tensors.size());
  const epl::ir::Program &h = m->programs.at(0), &f = f32->programs.at(0);
  int64_t halfBytes = 0, f32Bytes = 0;
  for (size_t t = 0; t < m->tensors.size(); ++t)
    if (h.offset[t] >= 0) {
      halfBytes += m->bytesOn(h, static_cast<int>(t));
      f32Bytes += f32->bytesOn(f, static_cast<int>(t));
    }
  CHECK(halfBytes < f32Bytes * 0.6);
  CHECK(h.paramBytes == f.paramBytes);
  CHECK(h.gradBytes == f.gradBytes);
  CHECK(h.optimizerBytes == f.optimizerBytes);
  // The CPU device's f32 copies of each call's half operands are planned in its workspace.
  bool staged = false;
  for (const epl::ir::Program::Workspace& w : h.workspaces) {
    CHECK(w.stagingBytes == m->ampStagingBytes(h, w.op));
    CHECK(w.bytes == m->workspaceBytes(h, w.op) + w.stagingBytes);
    staged = staged || (w.op == opOf(*m, epl::ir::OpKind::Attention) && w.stagingBytes > 0);
  }
  CHECK(staged);
  for (const epl::ir::Program::Workspace& w : f.workspaces)
    CHECK(w.stagingBytes == 0);
  // linear's forward writes its bf16 output itself, a block of rows in f32 in its workspace
  // (all 128 rows here); its products take the bf16 input as stored and the weight rounded
  // into half a copy's room: the staging holds the weight's halves and the bias's copy.
  int lin = opOf(*m, epl::ir::OpKind::Linear);
  const epl::ir::Op& head = ops[lin];
  auto padded = [](int64_t n) { return (n + 15) / 16 * 16; };
  int64_t y = m->bytesOn(h, head.outputs[0]) / 2;
  CHECK(m->storedDtype(head.inputs[0]) == DType::BF16);
  CHECK(y == 8 * 16 * 32);
  CHECK(m->workspaceBytes(h, lin) == 4 * y);
  CHECK(m->ampStagingBytes(h, lin) == 4 * (padded(32 * 64 / 2) + padded(32)));
  CHECK(f32->workspaceBytes(f, lin) == 0);
}

TEST_CASE("amp follows recomputation") {
  auto m = planAmp("amp = fp16 recompute = every");
  REQUIRE(m);
  for (const epl::ir::Op& op : m->ops)
    if (op.phase == epl::ir::Phase::Recompute)
      for (size_t k = 0; k < op.outputs.size(); ++k)
        CHECK(m->storedDtype(op.outputs[k]) == m->storedDtype(m->ops[op.forward].outputs[k]));
  CHECK(m->scalesLoss());
  CHECK(m->gradNorm >= 0); // fp16 reads the norm for overflows, without clipping
}

TEST_CASE("amp keeps a loss made of losses in f32: the model's result and its seed") {
  // `ce * 0.5 + ce` is what the trainer reads as the loss: stored in bf16 it read as 0.
  std::string text = kGpt;
  text.replace(
      text.find("return cross_entropy(linear(layer_norm(x), 32), next(tokens))"),
      std::string("return cross_entropy(linear(layer_norm(x), 32), next(tokens))").size(),
      "ce = cross_entropy(linear(layer_norm(x), 32), next(tokens))\n  return ce * 0.5 + ce");
  text.replace(text.find("%s"), 2, "amp = bf16");
  auto m = epl::testing::planned("amp_sum.epl", text, 1);
  REQUIRE(m);
  int loss = m->outputs.at(0);
  CHECK(m->ops[m->tensors[loss].producer].kind != epl::ir::OpKind::CrossEntropy);
  CHECK(m->storedDtype(loss) == DType::F32);
  CHECK(m->storedDtype(m->lossGrad) == DType::F32);
  CHECK(m->storedDtype(m->ops[opOf(*m, epl::ir::OpKind::Linear)].outputs[0]) == DType::BF16);
}

// A linear layer's call on bf16 views, its weights cast: the f32 kernel's result on the
// rounded operands, rounded to bf16 — bit for bit.
TEST_CASE("a half-precision call is the f32 kernel on rounded operands, its output rounded") {
  namespace wire = epl::backend::wire;
  auto dev = epl::backend::makeCpuDevice(1);
  const int64_t rows = 5, in = 7, out = 3;
  std::vector<float> x(rows * in), w(out * in), b(out);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.1f;
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = std::cos(0.91f * static_cast<float>(i)) * 0.77f;
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = 0.1234567f * static_cast<float>(i + 1);
  epl::ir::Attrs attrs{{"out", int64_t{out}}};
  auto call = [&](void* xd, DType xt, void* yd, DType yt, DType cast, const float* wd,
                  const float* bd) {
    epl::backend::KernelCall c;
    c.kind = epl::ir::OpKind::Linear;
    c.attrs = &attrs;
    c.in = {{xd, xt, {rows, in}},
            {const_cast<float*>(wd), DType::F32, {out, in}},
            {const_cast<float*>(bd), DType::F32, {out}}};
    c.out = {{yd, yt, {rows, out}}};
    c.castParams = cast;
    c.firstParam = 1;
    c.paramCount = 2;
    dev->launch(c);
  };
  std::vector<uint16_t> xh(x.size()), yh(rows * out);
  for (size_t i = 0; i < x.size(); ++i)
    xh[i] = wire::toBf16(x[i]);
  call(xh.data(), DType::BF16, yh.data(), DType::BF16, DType::BF16, w.data(), b.data());
  // The same call in f32 on the rounded values.
  std::vector<float> xr(x.size()), wr(w.size()), br(b.size()), y(rows * out);
  for (size_t i = 0; i < x.size(); ++i)
    xr[i] = wire::fromBf16(xh[i]);
  for (size_t i = 0; i < w.size(); ++i)
    wr[i] = wire::fromBf16(wire::toBf16(w[i]));
  for (size_t i = 0; i < b.size(); ++i)
    br[i] = wire::fromBf16(wire::toBf16(b[i]));
  call(xr.data(), DType::F32, y.data(), DType::F32, DType::F32, wr.data(), br.data());
  for (size_t i = 0; i < y.size(); ++i) {
    INFO("element " << i);
    CHECK(yh[i] == wire::toBf16(y[i]));
  }
  // Without the cast the weights are read as they are: another result.
  std::vector<uint16_t> uncast(rows * out);
  call(xh.data(), DType::BF16, uncast.data(), DType::BF16, DType::F32, w.data(), b.data());
  CHECK(uncast != yh);
}

// amp = fp16 with a loss scale so large that the first backward overflows half's range: the
// step updates nothing and halves the scale; at a sound scale the next one updates.
TEST_CASE("an fp16 gradient overflow skips exactly that step and halves the loss scale") {
  std::string text = R"(
model net(x: f32[B, 16]) {
  return mse(linear(x, 16), x)
}
policy { amp = fp16  loss_scale = 1e30 }
train net {
  data = synthetic(samples = 64)
  batch = 8
  optimizer = adam(lr = 1e-2)
}
)";
  auto m = epl::testing::planned("overflow.epl", text, 1);
  REQUIRE(m);
  auto dev = epl::backend::makeCpuDevice(1);
  auto comm = epl::backend::makeSelfComm();
  epl::interp::Executor ex(*m, *dev, *comm, {});
  CHECK(ex.lossScale() == 1e30);
  for (size_t p = 0; p < m->params.size(); ++p) { // the trainer's initializer aside
    std::vector<float> w(static_cast<size_t>(ex.paramElements(static_cast<int>(p))));
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = 0.1f * std::cos(static_cast<float>(i + 17 * p));
    ex.writeParam(static_cast<int>(p), w.data());
  }
  std::vector<float> x(8 * 16);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(static_cast<float>(i));
  auto& input = ex.staging(0).inputs;
  REQUIRE(input.size() == 1);
  REQUIRE(input[0].bytes() == static_cast<int64_t>(x.size() * 4));
  std::memcpy(input[0].data(), x.data(), x.size() * 4);
  auto weights = [&] {
    std::vector<float> w(static_cast<size_t>(ex.paramElements(0)));
    ex.readParam(0, w.data());
    return w;
  };
  std::vector<float> before = weights();
  epl::interp::StepResult r = ex.runStep(0, 1e-2f, 1);
  CHECK(r.skipped);
  CHECK(r.lossScale == 1e30);
  CHECK(std::isfinite(r.loss));
  CHECK(weights() == before);
  CHECK(ex.lossScale() == 5e29);
  ex.setLossScale(1024, 0);
  r = ex.runStep(1, 1e-2f, 1);
  CHECK_FALSE(r.skipped);
  CHECK(r.lossScale == 1024);
  CHECK(std::isfinite(r.gradNorm));
  CHECK(r.gradNorm > 0);
  CHECK(weights() != before);
  CHECK(ex.lossScale() == 1024);
  CHECK(ex.lossScaleSteps() == 1);
}

// In split regions partial sums stay f32, rounded once summed (as one device rounds the
// whole sum): the inputs of all-reduces, the outputs of identities (whose gradients are
// partial). Gathered and sliced tensors, and a vocabulary-parallel loss's logits, are half.
TEST_CASE("amp keeps split regions' partial sums in f32") {
  auto m = epl::testing::planned("split.epl", R"(
model lm(tokens: i32[B, 16]) {
  x = embedding(tokens, 32, 64)
  split(2) {
    x = x + linear(gelu(linear(layer_norm(x), 128)), 64)
    loss = cross_entropy(linear(layer_norm(x), 32), next(tokens))
  }
  return loss
}
policy { amp = bf16 }
train lm {
  data = synthetic(samples = 64, classes = 32)
  batch = 8
}
)",
                                 2);
  REQUIRE(m);
  REQUIRE(m->mesh.stages.at(0).splitWidth == 2);
  auto isF32 = [&](int t) { return m->storedDtype(t) == DType::F32; };
  int collectives = 0, half = 0;
  for (const epl::ir::Op& op : m->ops) {
    if (op.phase != epl::ir::Phase::Forward) continue;
    INFO(epl::ir::opInfo(op.kind).name << " " << op.name);
    if (op.kind == epl::ir::OpKind::AllReduce) {
      ++collectives;
      CHECK(isF32(op.inputs[0]));
      CHECK_FALSE(isF32(op.outputs[0]));
    }
    if (op.kind == epl::ir::OpKind::Identity) {
      ++collectives;
      CHECK(isF32(op.outputs[0]));
    }
    if (op.kind == epl::ir::OpKind::CrossEntropy) {
      CHECK(op.splitForm == epl::ir::SplitForm::Vocab);
      CHECK_FALSE(isF32(op.inputs[0]));
    }
    if (op.kind == epl::ir::OpKind::Gelu) half += m->storedDtype(op.outputs[0]) == DType::BF16;
  }
  CHECK(collectives > 0);
  CHECK(half == 1);
}
