// amp's kernels that read and write half-precision tensors as they are stored
// (ir::OpInfo::halfAsStored: add, layer_norm, cross_entropy): the same bits as the f32 kernel run
// on widened copies (backend/HalfStaging.h's staging, which the other kernels still take), in bf16
// and IEEE half, forward and backward, adding into a gradient, and with broadcasting.
#include "backend/Device.h"
#include "backend/comm/Wire.h"
#include "backend/cpu/Kernels.h"
#include "ir/Ops.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

namespace wire = epl::backend::wire;
using epl::backend::KernelCall;
using epl::backend::TensorView;
using epl::ir::DType;

// A tensor's storage: n values of a pattern in f32, or rounded to a half type (i32 ids
// live in the f32 storage's bytes; no values at all: a null view, an output not wanted).
struct Stored {
  DType type;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<uint16_t> h;

  Stored(DType t, std::vector<int64_t> s, float step, float scale) : type(t), shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    for (int64_t i = 0; i < n; ++i) {
      float v = std::sin(step * static_cast<float>(i) + 0.3f) * scale;
      if (t == DType::F32)
        f.push_back(v);
      else
        h.push_back(t == DType::BF16 ? wire::toBf16(v) : wire::toF16(v));
    }
  }
  TensorView view() {
    bool wide = type == DType::F32 || type == DType::I32;
    void* p = wide ? static_cast<void*>(f.data()) : static_cast<void*>(h.data());
    return {f.empty() && h.empty() ? nullptr : p, type, shape};
  }
  bool operator==(const Stored& o) const { return f == o.f && h == o.h; }
};

// A call run both ways on copies of the same storage: as the device runs it (the kernel on
// the stored views) and staged (the f32 kernel on widened copies); the outputs must agree
// to the bit.
void checkBothWays(epl::ir::OpKind kind, bool backward, const epl::ir::Attrs& attrs,
                   std::vector<Stored> in, std::vector<Stored> out, std::vector<bool> accumulate,
                   void (*kernel)(const KernelCall&)) {
  REQUIRE(epl::ir::halfAsStored(kind));
  auto dev = epl::backend::makeCpuDevice(2);
  auto run = [&](bool staged) {
    std::vector<Stored> ins = in, outs = out;
    KernelCall c;
    c.kind = kind;
    c.backward = backward;
    c.attrs = &attrs;
    for (Stored& s : ins)
      c.in.push_back(s.view());
    for (Stored& s : outs)
      c.out.push_back(s.view());
    c.accumulate = accumulate;
    if (staged)
      epl::backend::cpu::launchStaged(c, kernel);
    else
      dev->launch(c);
    return outs;
  };
  std::vector<Stored> direct = run(false), staged = run(true);
  for (size_t i = 0; i < out.size(); ++i) {
    INFO("output " << i);
    CHECK(direct[i] == staged[i]);
    if (!out[i].f.empty() || !out[i].h.empty())
      CHECK_FALSE(direct[i] == out[i]); // the kernel wrote it
  }
}

} // namespace

TEST_CASE("layer_norm reads and writes half precision as stored: the bits of widened copies") {
  epl::ir::Attrs attrs{{"eps", 1e-5}};
  const int64_t n = 37, d = 48; // rows of the pool's pieces and a ragged last one
  for (DType t : {DType::BF16, DType::F16}) {
    for (DType stats : {t, DType::F32}) {
      INFO("type " << static_cast<int>(t) << ", statistics " << static_cast<int>(stats));
      Stored x(t, {n, d}, 0.41f, 1.7f), w(DType::F32, {d}, 0.7f, 1.1f),
          b(DType::F32, {d}, 0.3f, 0.2f);
      checkBothWays(epl::ir::OpKind::LayerNorm, false, attrs, {x, w, b},
                    {Stored(t, {n, d}, 0.1f, 0.f), Stored(stats, {n}, 0.1f, 0.f),
                     Stored(stats, {n}, 0.1f, 0.f)},
                    {}, epl::backend::cpu::layerNorm);
      // in = [dy, x, w, b, y, mean, rstd], out = [dx (added into), dw, db].
      Stored dy(t, {n, d}, 0.29f, 0.8f), mean(stats, {n}, 0.37f, 0.1f);
      Stored rstd(stats, {n}, 0.f, 0.f);
      for (float& v : rstd.f)
        v = 1.3f;
      for (uint16_t& v : rstd.h)
        v = t == DType::BF16 ? wire::toBf16(1.3f) : wire::toF16(1.3f);
      Stored y(t, {n, d}, 0.5f, 1.f);
      checkBothWays(epl::ir::OpKind::LayerNorm, true, attrs, {dy, x, w, b, y, mean, rstd},
                    {Stored(t, {n, d}, 0.23f, 0.5f), Stored(DType::F32, {d}, 0.1f, 0.f),
                     Stored(DType::F32, {d}, 0.1f, 0.f)},
                    {true, false, false}, epl::backend::cpu::layerNorm);
    }
  }
}

TEST_CASE("add reads and writes half precision as stored: the bits of widened copies") {
  epl::ir::Attrs attrs;
  const int64_t b = 3, s = 70, d = 40;
  for (DType t : {DType::BF16, DType::F16}) {
    INFO("type " << static_cast<int>(t));
    Stored x(t, {b, s, d}, 0.41f, 1.7f), r(t, {b, s, d}, 0.23f, 0.9f);
    Stored pos(t, {s, d}, 0.37f, 0.4f), wide(DType::F32, {b, s, d}, 0.19f, 2.f);
    auto fresh = [&](DType type, std::vector<int64_t> shape) {
      return Stored(type, shape, 0.1f, 0.f);
    };
    // The residual's sum, a broadcast one (positions), and f32 with half.
    checkBothWays(epl::ir::OpKind::Add, false, attrs, {x, r}, {fresh(t, {b, s, d})}, {},
                  epl::backend::cpu::add);
    checkBothWays(epl::ir::OpKind::Add, false, attrs, {x, pos}, {fresh(t, {b, s, d})}, {},
                  epl::backend::cpu::add);
    checkBothWays(epl::ir::OpKind::Add, false, attrs, {wide, x}, {fresh(t, {b, s, d})}, {},
                  epl::backend::cpu::add);
    // in = [dy, a, b, y], out = [da, db]: added into and written, then summed over the batch
    // into half and into f32.
    Stored dy(t, {b, s, d}, 0.29f, 0.8f);
    checkBothWays(epl::ir::OpKind::Add, true, attrs, {dy, x, r, Stored(t, {b, s, d}, 0.5f, 1.f)},
                  {Stored(t, {b, s, d}, 0.31f, 0.6f), fresh(t, {b, s, d})}, {true, false},
                  epl::backend::cpu::add);
    checkBothWays(epl::ir::OpKind::Add, true, attrs, {dy, x, pos, Stored(t, {b, s, d}, 0.5f, 1.f)},
                  {fresh(t, {b, s, d}), Stored(t, {s, d}, 0.31f, 0.6f)}, {false, true},
                  epl::backend::cpu::add);
    checkBothWays(epl::ir::OpKind::Add, true, attrs,
                  {dy, x, Stored(DType::F32, {s, d}, 0.2f, 1.f), Stored(t, {b, s, d}, 0.5f, 1.f)},
                  {fresh(t, {b, s, d}), fresh(DType::F32, {s, d})}, {false, false},
                  epl::backend::cpu::add);
  }
}

TEST_CASE("cross_entropy reads and writes half precision as stored: the bits of widened copies") {
  const int64_t n = 45, v = 70;
  for (DType t : {DType::BF16, DType::F16}) {
    for (int64_t ignored : {int64_t{-100}, int64_t{3}}) {
      INFO("type " << static_cast<int>(t) << ", ignore_index " << ignored);
      epl::ir::Attrs attrs{{"ignore_index", ignored}};
      Stored logits(t, {n, v}, 0.41f, 3.f), targets(DType::F32, {n}, 0.f, 0.f);
      // Class ids as i32 in the f32 storage's bytes: every class, and 3 now and then.
      for (int64_t r = 0; r < n; ++r) {
        int32_t k = static_cast<int32_t>(r % 5 == 0 ? 3 : (r * 7) % v);
        std::memcpy(&targets.f[static_cast<size_t>(r)], &k, 4);
      }
      targets.type = DType::I32;
      checkBothWays(epl::ir::OpKind::CrossEntropy, false, attrs, {logits, targets},
                    {Stored(DType::F32, {}, 0.f, 0.f), Stored(DType::F32, {n}, 0.1f, 0.f)}, {},
                    epl::backend::cpu::crossEntropy);
      // in = [dloss, logits, targets, loss, lse], out = [dlogits (added into), dtargets].
      Stored dloss(DType::F32, {}, 0.f, 0.f), lse(DType::F32, {n}, 0.f, 0.f);
      dloss.f = {0.7f};
      for (float& l : lse.f)
        l = 4.5f;
      checkBothWays(epl::ir::OpKind::CrossEntropy, true, attrs,
                    {dloss, logits, targets, Stored(DType::F32, {}, 0.f, 0.f), lse},
                    {Stored(t, {n, v}, 0.23f, 0.5f), Stored(DType::F32, {0}, 0.f, 0.f)},
                    {true, false}, epl::backend::cpu::crossEntropy);
    }
  }
}
