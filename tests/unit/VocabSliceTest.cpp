// cross_entropy over a vocabulary split (KernelCall::vocabSlice): each slice's forward gives
// its rows' log-sum-exp and its mean target logit, which the device combines into the whole
// loss (KernelCall::vocabSlices, as Executor::vocabCrossEntropy calls it on the gathered
// figures); each slice's backward, given the whole rows'
// log-sum-exp, is its columns of the whole gradient. On the CPU device, the guarded one
// (its memory is not the host's, as a GPU's), and a GPU where there is one.
#include "backend/Device.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace {

using epl::backend::Device;
using epl::backend::KernelCall;
using epl::backend::TensorView;

// A device buffer holding `values`, freed with its device.
struct Buffer {
  Buffer(Device& dev, const void* values, int64_t bytes) : dev(dev), p(dev.allocate(bytes)) {
    if (values) dev.copyToDevice(p, values, bytes);
  }
  ~Buffer() { dev.release(p); }
  template <class T> std::vector<T> read(int64_t n) const {
    std::vector<T> out(static_cast<size_t>(n));
    dev.copyToHost(out.data(), p, 4 * n);
    dev.synchronize();
    return out;
  }
  Device& dev;
  void* p;
};

TensorView viewOf(void* p, std::vector<int64_t> shape, epl::ir::DType t = epl::ir::DType::F32) {
  TensorView v;
  v.data = p;
  v.shape = std::move(shape);
  v.dtype = t;
  return v;
}

struct Run {
  float loss = 0;
  std::vector<float> lse, grad;
};

// cross_entropy forward and backward over columns [first, first + v) of `logits` (rows x
// whole): the whole when slice is false. The backward takes `lse` (the whole rows').
Run crossEntropy(Device& dev, const std::vector<float>& logits, const std::vector<int32_t>& t,
                 int64_t rows, int64_t whole, int64_t first, int64_t v, bool slice,
                 const std::vector<float>* lse) {
  static const epl::ir::Attrs attrs{{"ignore_index", int64_t{3}}};
  std::vector<float> mine;
  for (int64_t r = 0; r < rows; ++r)
    mine.insert(mine.end(), logits.begin() + r * whole + first,
                logits.begin() + r * whole + first + v);
  float dloss = 1.f;
  Buffer x(dev, mine.data(), 4 * rows * v), targets(dev, t.data(), 4 * rows), loss(dev, nullptr, 4),
      saved(dev, lse ? lse->data() : nullptr, 4 * rows), grad(dev, nullptr, 4 * rows * v),
      seed(dev, &dloss, 4);
  KernelCall c;
  c.kind = epl::ir::OpKind::CrossEntropy;
  c.attrs = &attrs;
  c.vocabSlice = slice;
  c.vocabFirst = first;
  Run out;
  if (!lse) {
    c.in = {viewOf(x.p, {rows, v}), viewOf(targets.p, {rows}, epl::ir::DType::I32)};
    c.out = {viewOf(loss.p, {}), viewOf(saved.p, {rows})};
    dev.launch(c);
    out.loss = loss.read<float>(1)[0];
    out.lse = saved.read<float>(rows);
    return out;
  }
  c.backward = true;
  c.in = {viewOf(seed.p, {}), viewOf(x.p, {rows, v}),
          viewOf(targets.p, {rows}, epl::ir::DType::I32), viewOf(nullptr, {}),
          viewOf(saved.p, {rows})};
  c.out = {viewOf(grad.p, {rows, v}), viewOf(nullptr, {rows}, epl::ir::DType::I32)};
  c.accumulate = {false, false};
  dev.launch(c);
  out.grad = grad.read<float>(rows * v);
  return out;
}

// The device's combination of the slices' figures (KernelCall::vocabSlices): the whole
// rows' log-sum-exp and the loss.
Run combined(Device& dev, const std::vector<Run>& parts, const std::vector<int32_t>& t) {
  static const epl::ir::Attrs attrs{{"ignore_index", int64_t{3}}};
  auto rows = static_cast<int64_t>(t.size());
  auto w = static_cast<int64_t>(parts.size());
  std::vector<float> all; // each slice's [lse of every row, mean target logit]
  for (const Run& p : parts) {
    all.insert(all.end(), p.lse.begin(), p.lse.end());
    all.push_back(p.loss);
  }
  Buffer figures(dev, all.data(), 4 * w * (rows + 1)), targets(dev, t.data(), 4 * rows),
      loss(dev, nullptr, 4), lse(dev, nullptr, 4 * rows);
  KernelCall c;
  c.kind = epl::ir::OpKind::CrossEntropy;
  c.attrs = &attrs;
  c.vocabSlices = static_cast<int>(w);
  c.in = {viewOf(figures.p, {w, rows + 1}), viewOf(targets.p, {rows}, epl::ir::DType::I32)};
  c.out = {viewOf(loss.p, {}), viewOf(lse.p, {rows})};
  dev.launch(c);
  Run out;
  out.loss = loss.read<float>(1)[0];
  out.lse = lse.read<float>(rows);
  return out;
}

} // namespace

TEST_CASE("cross_entropy over a vocabulary split: the slices' figures make the whole loss") {
  const int64_t rows = 6, whole = 12, w = 3, v = whole / w;
  std::vector<float> logits(rows * whole);
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = std::sin(0.7f * static_cast<float>(i)) * 3.f;
  // Row 2's target is the ignored class 3; the others land in every slice.
  std::vector<int32_t> t{0, 5, 3, 11, 7, 4};
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(epl::backend::makeCpuDevice(1));
  devices.push_back(epl::backend::makeGuardedCpuDevice(1));
  if (epl::backend::cudaAvailable()) devices.push_back(epl::backend::makeDevice("cuda", {}));
  for (auto& dev : devices) {
    INFO(dev->name());
    Run ref = crossEntropy(*dev, logits, t, rows, whole, 0, whole, false, nullptr);
    Run back = crossEntropy(*dev, logits, t, rows, whole, 0, whole, false, &ref.lse);
    std::vector<Run> parts;
    for (int k = 0; k < w; ++k)
      parts.push_back(crossEntropy(*dev, logits, t, rows, whole, k * v, v, true, nullptr));
    // The device combines them (Executor::vocabCrossEntropy, after the all-gather).
    Run all = combined(*dev, parts, t);
    const std::vector<float>& lse = all.lse;
    for (int64_t r = 0; r < rows; ++r)
      CHECK(lse[r] == Approx(ref.lse[r]).epsilon(1e-6));
    CHECK(all.loss == Approx(ref.loss).epsilon(1e-6));
    // Nothing kept: 0, as the whole loss gives it.
    CHECK(combined(*dev, parts, {3, 3, 3, 3, 3, 3}).loss == 0.f);
    // Each slice's gradient, from the whole rows' log-sum-exp: its columns of the whole's.
    for (int k = 0; k < w; ++k) {
      Run g = crossEntropy(*dev, logits, t, rows, whole, k * v, v, true, &lse);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < v; ++j)
          CHECK(g.grad[r * v + j] == Approx(back.grad[r * whole + k * v + j]).margin(1e-7));
    }
  }
}
