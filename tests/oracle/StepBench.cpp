// Times one training step of a char-GPT and of an MLP classifier through the CPU device's
// kernels alone (no interpreter): forward, backward and AdamW, the same layers as
// step_bench.py builds in PyTorch. A benchmark program, not a test: it prints milliseconds.
//
// Usage: epl_step_bench [gpt|mlp] [steps] [threads, 0 = all cores]
// Shape legend: B batch, T time, D width, H heads, V vocab, F hidden width, L layers.
#include "backend/Device.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace epl;
using backend::KernelCall;
using backend::TensorView;
using ir::OpKind;

class Bench {
public:
  explicit Bench(backend::Device& dev) : dev_(dev) {}
  ~Bench() {
    for (void* p : owned_)
      dev_.release(p);
  }

  TensorView tensor(std::vector<int64_t> shape, ir::DType t = ir::DType::F32) {
    TensorView v{nullptr, t, std::move(shape)};
    v.data = dev_.allocate(v.bytes());
    dev_.fillZero(v.data, v.bytes());
    owned_.push_back(v.data);
    return v;
  }
  TensorView randn(std::vector<int64_t> shape, float scale) {
    TensorView v = tensor(std::move(shape));
    std::normal_distribution<float> nd(0.f, scale);
    for (int64_t i = 0; i < v.numel(); ++i)
      v.f32()[i] = nd(rng_);
    return v;
  }
  TensorView tokens(std::vector<int64_t> shape, int32_t vocab) {
    TensorView v = tensor(std::move(shape), ir::DType::I32);
    for (int64_t i = 0; i < v.numel(); ++i)
      v.i32()[i] = static_cast<int32_t>(rng_() % vocab);
    return v;
  }
  // A parameter with its gradient and AdamW state.
  TensorView param(std::vector<int64_t> shape, float scale) {
    TensorView p = scale > 0.f ? randn(shape, scale) : tensor(shape);
    if (scale < 0) std::fill(p.f32(), p.f32() + p.numel(), 1.f); // norm weights start at 1
    params_.push_back({p, tensor(shape), tensor(shape), tensor(shape)});
    return p;
  }
  TensorView gradOf(const TensorView& p) {
    for (auto& q : params_)
      if (q[0].data == p.data) return q[1];
    std::abort();
  }

  // One op: forward now, backward recorded for later (in reverse order).
  void op(OpKind k, const ir::Attrs* attrs, std::vector<TensorView> in, std::vector<TensorView> out,
          std::vector<TensorView> bwdIn, std::vector<TensorView> bwdOut, std::vector<bool> acc) {
    KernelCall f;
    f.kind = k;
    f.attrs = attrs;
    f.in = std::move(in);
    f.out = std::move(out);
    forward_.push_back(f);
    KernelCall b = f;
    b.backward = true;
    b.in = std::move(bwdIn);
    b.out = std::move(bwdOut);
    b.accumulate = std::move(acc);
    backward_.insert(backward_.begin(), b);
  }

  void step(int64_t t) {
    for (auto& k : forward_)
      timed(k);
    for (auto& k : backward_)
      timed(k);
    backend::OptimizerCall oc;
    oc.kind = backend::OptimizerKind::AdamW;
    oc.lr = 3e-4f;
    oc.weightDecay = 0.1f;
    oc.step = t;
    for (auto& p : params_) {
      oc.param = p[0];
      oc.grad = p[1];
      oc.state1 = p[2];
      oc.state2 = p[3];
      dev_.optimizerStep(oc);
    }
  }

  TensorView null(const TensorView& t) { return TensorView{nullptr, t.dtype, t.shape}; }

  // With EPL_BENCH_PROFILE set: wall and cpu milliseconds per op kind and direction, per step.
  void printProfile(int steps) const {
    for (const auto& [key, ms] : profile_)
      std::printf("  %-16s %-8s %8.2f ms  cpu %8.2f ms\n", ir::opInfo(key.first).name.c_str(),
                  key.second ? "backward" : "forward", ms.first / steps, ms.second / steps);
  }
  void resetProfile() { profile_.clear(); }

private:
  void timed(const KernelCall& k) {
    if (!profiling_) return dev_.launch(k);
    auto t0 = std::chrono::steady_clock::now();
    std::clock_t c0 = std::clock();
    dev_.launch(k);
    auto& p = profile_[{k.kind, k.backward}];
    p.first +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    p.second += 1000.0 * double(std::clock() - c0) / CLOCKS_PER_SEC;
  }

  bool profiling_ = std::getenv("EPL_BENCH_PROFILE") != nullptr;
  std::map<std::pair<OpKind, bool>, std::pair<double, double>> profile_; // wall, cpu ms

  backend::Device& dev_;
  std::mt19937 rng_{1};
  std::vector<void*> owned_;
  std::vector<std::vector<TensorView>> params_;
  std::vector<KernelCall> forward_, backward_;
};

// Attribute maps must outlive the calls.
struct Attrs {
  ir::Attrs ln{{"eps", 1e-5}}, none;
  ir::Attrs attn, mlp, head, linHidden, linOut;
};

// y = layer_norm(x); returns y, records the backward (dx accumulated when accX).
TensorView layerNorm(Bench& b, const Attrs& a, const TensorView& x, const TensorView& dx,
                     const TensorView& dy, bool accX) {
  int64_t d = x.shape.back();
  std::vector<int64_t> rows(x.shape.begin(), x.shape.end() - 1);
  TensorView w = b.param({d}, -1.f), bias = b.param({d}, 0.f);
  TensorView y = b.tensor(x.shape), mean = b.tensor(rows), rstd = b.tensor(rows);
  b.op(OpKind::LayerNorm, &a.ln, {x, w, bias}, {y, mean, rstd},
       {dy, x, w, bias, b.null(y), mean, rstd}, {dx, b.gradOf(w), b.gradOf(bias)},
       {accX, false, false});
  return y;
}

void buildGpt(Bench& b, Attrs& a, int64_t B, int64_t T, int64_t D, int64_t H, int64_t V,
              int64_t L) {
  a.attn = {{"heads", int64_t{H}}, {"causal", true}};
  a.mlp = {{"hidden", 4 * D}, {"act", std::string("gelu")}};
  a.head = {{"out", V}, {"bias", true}};
  float s = 0.02f;
  TensorView tok = b.tokens({B, T}, V), tgt = b.tokens({B, T}, V);
  TensorView emb = b.param({V, D}, s), pos = b.param({T, D}, s);
  TensorView e = b.tensor({B, T, D}), p = b.tensor({T, D}), x = b.tensor({B, T, D});
  TensorView de = b.tensor({B, T, D}), dx = b.tensor({B, T, D}), dp = b.tensor({T, D});
  b.op(OpKind::Embedding, nullptr, {tok, emb}, {e}, {de, tok, emb, b.null(e)},
       {b.null(de), b.gradOf(emb)}, {false, false});
  b.op(OpKind::Positions, nullptr, {pos}, {p}, {dp, pos, b.null(p)}, {b.gradOf(pos)}, {false});
  b.op(OpKind::Add, nullptr, {e, p}, {x}, {dx, b.null(e), b.null(p), b.null(x)}, {de, dp},
       {false, false});
  for (int64_t l = 0; l < L; ++l) {
    TensorView da = b.tensor({B, T, D}), dat = b.tensor({B, T, D});
    TensorView an = layerNorm(b, a, x, dx, da, true);
    TensorView wq = b.param({3 * D, D}, s), bq = b.param({3 * D}, 0.f);
    TensorView wp = b.param({D, D}, s), bp = b.param({D}, 0.f);
    TensorView at = b.tensor({B, T, D}), qkv = b.tensor({B, T, 3 * D}), ctx = b.tensor({B, T, D}),
               lse = b.tensor({B, H, T});
    b.op(OpKind::Attention, &a.attn, {an, wq, bq, wp, bp}, {at, qkv, ctx, lse},
         {dat, an, wq, bq, wp, bp, b.null(at), qkv, ctx, lse},
         {da, b.gradOf(wq), b.gradOf(bq), b.gradOf(wp), b.gradOf(bp)},
         {false, false, false, false, false});
    TensorView x1 = b.tensor({B, T, D}), dx1 = b.tensor({B, T, D});
    b.op(OpKind::Add, nullptr, {x, at}, {x1}, {dx1, b.null(x), b.null(at), b.null(x1)}, {dx, dat},
         {false, false});
    TensorView dm = b.tensor({B, T, D}), dmo = b.tensor({B, T, D});
    TensorView mn = layerNorm(b, a, x1, dx1, dm, true);
    TensorView w1 = b.param({4 * D, D}, s), b1 = b.param({4 * D}, 0.f);
    TensorView w2 = b.param({D, 4 * D}, s), b2 = b.param({D}, 0.f);
    TensorView mo = b.tensor({B, T, D}), h = b.tensor({B, T, 4 * D});
    b.op(OpKind::Mlp, &a.mlp, {mn, w1, b1, w2, b2}, {mo, h},
         {dmo, mn, w1, b1, w2, b2, b.null(mo), h},
         {dm, b.gradOf(w1), b.gradOf(b1), b.gradOf(w2), b.gradOf(b2)},
         {false, false, false, false, false});
    TensorView x2 = b.tensor({B, T, D}), dx2 = b.tensor({B, T, D});
    b.op(OpKind::Add, nullptr, {x1, mo}, {x2}, {dx2, b.null(x1), b.null(mo), b.null(x2)},
         {dx1, dmo}, {false, false});
    x = x2;
    dx = dx2;
  }
  TensorView df = b.tensor({B, T, D});
  TensorView f = layerNorm(b, a, x, dx, df, false);
  TensorView wh = b.param({V, D}, s), bh = b.param({V}, 0.f);
  TensorView logits = b.tensor({B, T, V}), dlogits = b.tensor({B, T, V});
  b.op(OpKind::Linear, &a.head, {f, wh, bh}, {logits}, {dlogits, f, wh, bh, b.null(logits)},
       {df, b.gradOf(wh), b.gradOf(bh)}, {false, false, false});
  TensorView loss = b.tensor({}), lse = b.tensor({B, T}), dloss = b.tensor({});
  dloss.f32()[0] = 1.f;
  b.op(OpKind::CrossEntropy, nullptr, {logits, tgt}, {loss, lse},
       {dloss, logits, tgt, b.null(loss), lse}, {dlogits, b.null(dlogits)}, {false, false});
}

void buildMlp(Bench& b, Attrs& a, int64_t B, int64_t In, int64_t Hd, int64_t C) {
  a.linHidden = {{"out", Hd}, {"bias", true}};
  a.linOut = {{"out", C}, {"bias", true}};
  TensorView x = b.randn({B, In}, 1.f), dxIn = b.tensor({B, In});
  TensorView tgt = b.tokens({B}, static_cast<int32_t>(C));
  std::vector<int64_t> widths{Hd, Hd};
  TensorView dx = b.null(dxIn);
  for (int64_t w : widths) {
    int64_t in = x.shape.back();
    TensorView wt = b.param({w, in}, 0.05f), bias = b.param({w}, 0.f);
    TensorView h = b.tensor({B, w}), dh = b.tensor({B, w}), r = b.tensor({B, w}),
               dr = b.tensor({B, w});
    b.op(OpKind::Linear, &a.linHidden, {x, wt, bias}, {h}, {dh, x, wt, bias, b.null(h)},
         {dx, b.gradOf(wt), b.gradOf(bias)}, {false, false, false});
    b.op(OpKind::Relu, nullptr, {h}, {r}, {dr, b.null(h), r}, {dh}, {false});
    x = r;
    dx = dr;
  }
  TensorView wo = b.param({C, Hd}, 0.05f), bo = b.param({C}, 0.f);
  TensorView logits = b.tensor({B, C}), dlogits = b.tensor({B, C});
  b.op(OpKind::Linear, &a.linOut, {x, wo, bo}, {logits}, {dlogits, x, wo, bo, b.null(logits)},
       {dx, b.gradOf(wo), b.gradOf(bo)}, {false, false, false});
  TensorView loss = b.tensor({}), lse = b.tensor({B}), dloss = b.tensor({});
  dloss.f32()[0] = 1.f;
  b.op(OpKind::CrossEntropy, nullptr, {logits, tgt}, {loss, lse},
       {dloss, logits, tgt, b.null(loss), lse}, {dlogits, b.null(dlogits)}, {false, false});
}

} // namespace

int main(int argc, char** argv) {
  std::string which = argc > 1 ? argv[1] : "gpt";
  int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  int threads = argc > 3 ? std::atoi(argv[3]) : 0;
  auto dev = backend::makeCpuDevice(threads);
  Bench b(*dev);
  Attrs a;
  if (which == "gpt")
    buildGpt(b, a, 32, 128, 256, 8, 256, 6);
  else
    buildMlp(b, a, 128, 784, 256, 10);
  b.step(1); // warm up: first-touch of every buffer
  b.resetProfile();
  double best = 1e30, total = 0, cpuBest = 1e30;
  for (int s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    std::clock_t c0 = std::clock();
    b.step(s + 2);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, ms);
    cpuBest = std::min(cpuBest, 1000.0 * double(std::clock() - c0) / CLOCKS_PER_SEC);
    total += ms;
  }
  // CPU time (all threads) is steadier than wall time on a shared machine.
  std::printf("%s step: %.2f ms best, %.2f ms mean of %d, cpu %.2f ms (%s)\n", which.c_str(), best,
              total / steps, steps, cpuBest, dev->name().c_str());
  b.printProfile(steps);
  return 0;
}
