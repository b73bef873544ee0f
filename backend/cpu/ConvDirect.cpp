// conv2d through oneDNN's direct convolution (its JIT kernels on the CPU's vector units),
// which reads the images in place of im2col's columns: the column copies, their products'
// packing and col2im's scatter were two thirds of a small CNN's step (docs/architecture.md,
// "The CPU backend").
//
// The batch is cut into groups of images and the groups into lanes (ir::convDirectPlan,
// from the shapes alone); each lane runs its groups in order on one thread of the pool,
// through single-threaded primitives, in its own part of the call's workspace, so no result
// depends on the thread count:
//   1. the weights reordered once into the layout the primitives want (channels blocked);
//   2. per group: its images (and dy) reordered into that layout, the primitive run, its
//      output reordered back to NCHW; in the backward the group's weight and bias gradients
//      added to its lane's sums;
//   3. the lanes' sums added in lane order.
//
// Shape legend: B batch, C input channels, Co output channels, H, W input height and
// width, K kernel, Ho, Wo output height and width, P = Ho*Wo.
#include "backend/cpu/ConvDirect.h"

#include "backend/KernelShapes.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Parallel.h"

#include <cstdlib>
#include <cstring>
#include <string>

#ifdef EPL_HAVE_ONEDNN
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#endif

namespace epl::backend::cpu {

#ifndef EPL_HAVE_ONEDNN
bool convDirect(const KernelCall&, bool) {
  return false;
}

bool convDirectInUse() {
  return false;
}
#else

namespace {

using Geometry = ConvGeometry;
using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

// EPL_CPU_CONV=im2col keeps Conv.cpp's im2col + GEMM (to compare the two, and tested so).
bool directWanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("EPL_CPU_CONV");
    return !(v && std::string(v) == "im2col");
  }();
  return wanted;
}

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
dnnl::stream& threadStream() {
  thread_local dnnl::stream s(engine());
  return s;
}

dnnl::primitive_attr userScratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

// A primitive's scratchpad in the thread's scratch slot 5 (the primitives run one at a time
// on a thread, so they share it).
memory scratchpad(const memory::desc& d) {
  return memory(d, engine(),
                scratch(5, std::max<int64_t>(1, static_cast<int64_t>(d.get_size() / 4))));
}

// A reorder between a tensor's NCHW (OIHW) layout and the one a primitive wants; none where
// the two are the same.
struct Reorder {
  bool none = true;
  dnnl::reorder::primitive_desc pd;
  dnnl::reorder prim;
  Reorder() = default;
  Reorder(const memory::desc& from, const memory::desc& to) : none(from == to) {
    if (none) return;
    pd = dnnl::reorder::primitive_desc(engine(), from, engine(), to, userScratchpad());
    prim = dnnl::reorder(pd);
  }
  void run(memory& from, memory& to) const {
    prim.execute(threadStream(), {{DNNL_ARG_FROM, from},
                                  {DNNL_ARG_TO, to},
                                  {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  }
};

// The primitives of one convolution at one count of images, forward and backward.
struct Prims {
  memory::desc src, wei, bias, dst; // NCHW, OIHW, x
  dnnl::convolution_forward::primitive_desc fwdPd;
  dnnl::convolution_backward_data::primitive_desc dataPd;
  dnnl::convolution_backward_weights::primitive_desc weightsPd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data data;
  dnnl::convolution_backward_weights weights;
  Reorder srcIn, weiIn, dstOut; // forward
  Reorder dyIn, weiData, dxOut; // the input's gradient
  Reorder srcW, dyW, dwOut;     // the weights' gradient
};

Prims makePrims(const Geometry& g, int64_t n, bool hasBias) {
  Prims p;
  p.src = memory::desc({n, g.c, g.h, g.w}, kF32, Tag::nchw);
  p.wei = memory::desc({g.co, g.c, g.k, g.k}, kF32, Tag::oihw);
  p.bias = memory::desc({g.co}, kF32, Tag::x);
  p.dst = memory::desc({n, g.co, g.ho, g.wo}, kF32, Tag::nchw);
  memory::desc anySrc({n, g.c, g.h, g.w}, kF32, Tag::any);
  memory::desc anyWei({g.co, g.c, g.k, g.k}, kF32, Tag::any);
  memory::desc anyDst({n, g.co, g.ho, g.wo}, kF32, Tag::any);
  memory::desc noBias;
  const memory::desc& bias = hasBias ? p.bias : noBias;
  memory::dims strides{g.stride, g.stride}, pad{g.pad, g.pad};
  auto algo = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr = userScratchpad();
  p.fwdPd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, anySrc, anyWei, bias,
                                      anyDst, strides, pad, pad),
      attr, engine());
  p.dataPd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(algo, anySrc, anyWei, anyDst, strides, pad, pad), attr,
      engine(), p.fwdPd);
  p.weightsPd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algo, anySrc, anyWei, bias, anyDst, strides, pad,
                                               pad),
      attr, engine(), p.fwdPd);
  p.fwd = dnnl::convolution_forward(p.fwdPd);
  p.data = dnnl::convolution_backward_data(p.dataPd);
  p.weights = dnnl::convolution_backward_weights(p.weightsPd);
  p.srcIn = Reorder(p.src, p.fwdPd.src_desc());
  p.weiIn = Reorder(p.wei, p.fwdPd.weights_desc());
  p.dstOut = Reorder(p.fwdPd.dst_desc(), p.dst);
  p.dyIn = Reorder(p.dst, p.dataPd.diff_dst_desc());
  p.weiData = Reorder(p.wei, p.dataPd.weights_desc());
  p.dxOut = Reorder(p.dataPd.diff_src_desc(), p.src);
  p.srcW = Reorder(p.src, p.weightsPd.src_desc());
  p.dyW = Reorder(p.dst, p.weightsPd.diff_dst_desc());
  p.dwOut = Reorder(p.weightsPd.diff_weights_desc(), p.wei);
  return p;
}

// The primitives are built (their kernels generated) once per geometry, count of images and
// bias, single-threaded like every call of them (their blocking follows the thread count).
const Prims& prims(const Geometry& g, int64_t n, bool hasBias) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, bool>;
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Prims>> cache;
  Key key{n, g.c, g.h, g.w, g.co, g.k, g.stride, g.pad, g.ho, hasBias};
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Prims>& p = cache[key];
  if (!p) {
    keepOneDnnSingleThreaded();
    p = std::make_unique<Prims>(makePrims(g, n, hasBias));
  }
  return *p;
}

// A lane's buffers, carved from the call's workspace in ir::convDirectPlan's order, each at
// most the plan's bound for it (checked against the layout oneDNN picked).
class Carver {
public:
  explicit Carver(float* at) : at_(at) {}
  float* take(int64_t bound, const memory::desc& d) {
    EPL_ASSERT(static_cast<int64_t>(d.get_size() / 4) <= bound,
               "oneDNN's layout is larger than the workspace planned for it (convDirectPlan)");
    return take(bound);
  }
  float* take(int64_t floats) {
    float* p = at_;
    at_ += floats;
    return p;
  }

private:
  float* at_;
};

// `data` in the layout `to`: as it is where the reorder is none, else reordered into `buf`.
memory inLayout(const Reorder& r, const memory::desc& from, const memory::desc& to, float* data,
                float* buf) {
  memory user(from, engine(), data);
  if (r.none) return user;
  memory out(to, engine(), buf);
  r.run(user, out);
  return out;
}

// A primitive's output in `from`, for `data` in `to`: there directly where the reorder is
// none, else in `buf` until finishOut reorders it.
memory outLayout(const Reorder& r, const memory::desc& from, const memory::desc& to, float* data,
                 float* buf) {
  return r.none ? memory(to, engine(), data) : memory(from, engine(), buf);
}
void finishOut(const Reorder& r, const memory::desc& to, memory& out, float* data) {
  if (r.none) return;
  memory user(to, engine(), data);
  r.run(out, user);
}

void failed(const dnnl::error& e) {
  std::string msg = std::string("oneDNN's convolution failed: ") + e.what();
  EPL_ASSERT(false, msg.c_str());
}

// Runs body(primitives, lane buffers, first of its lane, b0, n) for each group of n images
// from b0: the lanes over the pool, each lane its groups (lane, lane + lanes, ...) in order
// on one thread. The primitives of a full group and of the last are looked up once here,
// not under the cache's lock in every group.
template <class Body>
void forLanes(const Geometry& g, const ir::ConvDirectPlan& d, bool hasBias, float* lanes,
              Body body) {
  const Prims& full = prims(g, d.images, hasBias);
  const Prims& last = prims(g, g.b - (d.groups - 1) * d.images, hasBias);
  parallelFor(d.lanes, 1, [&](int64_t lo, int64_t hi) {
    keepOneDnnSingleThreaded();
    try {
      for (int64_t lane = lo; lane < hi; ++lane)
        for (int64_t gi = lane; gi < d.groups; gi += d.lanes) {
          int64_t b0 = gi * d.images, n = std::min(d.images, g.b - b0);
          body(n == d.images ? full : last, lanes + lane * d.laneFloats, gi == lane, b0, n);
          threadStream().wait();
        }
    } catch (const dnnl::error& e) { // not across the pool's threads
      failed(e);
    }
  });
}

// The weights in the layout `want`: `full`, reordered once for the full groups, where the
// group's primitive wants that layout too (a smaller last group may not), else reordered
// again into `buf`.
memory weightsFor(const memory& full, const Reorder& r, const memory::desc& plain,
                  const memory::desc& want, const TensorView& w, float* buf) {
  if (full.get_desc() == want) return full;
  return inLayout(r, plain, want, w.f32(), buf);
}

// in = [x, W [Co, C, K, K], b [Co]?], out = [y [B, Co, Ho, Wo]].
void forward(const KernelCall& c, const Geometry& g, const ir::ConvDirectPlan& d, bool hasBias) {
  const TensorView &x = c.in[0], &w = c.in[1];
  float* ws = workspace(c, 0, 0, d.floats());
  const Prims& full = prims(g, d.images, hasBias);
  // 1. The weights in the primitives' layout, once.
  memory wei = inLayout(full.weiIn, full.wei, full.fwdPd.weights_desc(), w.f32(),
                        Carver(ws).take(d.weights, full.fwdPd.weights_desc()));
  float* y = c.out[0].f32();
  forLanes(
      g, d, hasBias, ws + d.weights, [&](const Prims& p, float* lane, bool, int64_t b0, int64_t) {
        Carver buf(lane);
        float* srcBuf = buf.take(d.in, p.fwdPd.src_desc());
        float* dstBuf = buf.take(d.out, p.fwdPd.dst_desc());
        float* weiBuf = buf.take(d.weights, p.fwdPd.weights_desc());
        float* ys = y + b0 * g.co * g.plane();
        memory src =
            inLayout(p.srcIn, p.src, p.fwdPd.src_desc(), x.f32() + b0 * g.c * g.h * g.w, srcBuf);
        memory dst = outLayout(p.dstOut, p.fwdPd.dst_desc(), p.dst, ys, dstBuf);
        std::unordered_map<int, memory> args{
            {DNNL_ARG_SRC, src},
            {DNNL_ARG_WEIGHTS, weightsFor(wei, p.weiIn, p.wei, p.fwdPd.weights_desc(), w, weiBuf)},
            {DNNL_ARG_DST, dst}};
        if (hasBias) args.emplace(DNNL_ARG_BIAS, memory(p.bias, engine(), c.in[2].f32()));
        args.emplace(DNNL_ARG_SCRATCHPAD, scratchpad(p.fwdPd.scratchpad_desc()));
        p.fwd.execute(threadStream(), args);
        finishOut(p.dstOut, p.dst, dst, ys);
      });
}

// A lane's buffers in the backward, in ir::convDirectPlan's order.
struct BackwardLane {
  float *dy, *in, *nchw, *dwBlocked, *wei, *group, *sums;
  BackwardLane(float* lane, const ir::ConvDirectPlan& d, const Prims& p) {
    Carver buf(lane);
    dy = buf.take(d.out, p.dataPd.diff_dst_desc());
    in = buf.take(d.in, p.dataPd.diff_src_desc());
    nchw = buf.take(d.nchw);
    dwBlocked = buf.take(d.weights, p.weightsPd.diff_weights_desc());
    wei = buf.take(d.weights, p.dataPd.weights_desc());
    group = buf.take(d.sums);
    sums = buf.take(d.sums);
  }
};

// One group's input gradient into dxs (count floats; added where dx accumulates, through
// the lane's NCHW buffer); dyd is dy in the primitive's layout.
void groupInputGrad(const Prims& p, const BackwardLane& l, const memory& dyd, const memory& wei,
                    float* dxs, bool acc, int64_t count) {
  float* target = acc ? l.nchw : dxs;
  memory dsrc = outLayout(p.dxOut, p.dataPd.diff_src_desc(), p.src, target, l.in);
  p.data.execute(threadStream(), {{DNNL_ARG_DIFF_DST, dyd},
                                  {DNNL_ARG_WEIGHTS, wei},
                                  {DNNL_ARG_DIFF_SRC, dsrc},
                                  {DNNL_ARG_SCRATCHPAD, scratchpad(p.dataPd.scratchpad_desc())}});
  finishOut(p.dxOut, p.src, dsrc, target);
  if (acc)
    for (int64_t e = 0; e < count; ++e)
      dxs[e] += target[e];
}

// One group's weight and bias gradients (OIHW, then Co) into l.group, then added to the
// lane's sums (the lane's first group: copied).
void groupWeightGrad(const Prims& p, const BackwardLane& l, const memory& src, const memory& dyw,
                     bool hasBias, bool firstOfLane, int64_t wn, int64_t sums) {
  memory dwm = outLayout(p.dwOut, p.weightsPd.diff_weights_desc(), p.wei, l.group, l.dwBlocked);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, dyw}, {DNNL_ARG_DIFF_WEIGHTS, dwm}};
  if (hasBias) args.emplace(DNNL_ARG_DIFF_BIAS, memory(p.bias, engine(), l.group + wn));
  args.emplace(DNNL_ARG_SCRATCHPAD, scratchpad(p.weightsPd.scratchpad_desc()));
  p.weights.execute(threadStream(), args);
  finishOut(p.dwOut, p.wei, dwm, l.group);
  int64_t n = hasBias ? sums : wn;
  for (int64_t e = 0; e < n; ++e)
    l.sums[e] = firstOfLane ? l.group[e] : l.sums[e] + l.group[e];
}

// in = [dy, x, W, b?, y], out = [dx, dW, db?].
void backward(const KernelCall& c, const Geometry& g, const ir::ConvDirectPlan& d, bool hasBias) {
  const TensorView &dyv = c.in[0], &x = c.in[1], &w = c.in[2];
  GradOut dx = gradOut(c, 0), dw = gradOut(c, 1), db = hasBias ? gradOut(c, 2) : GradOut{};
  float* ws = workspace(c, 0, 0, d.floats());
  const Prims& full = prims(g, d.images, hasBias);
  memory wei;
  if (dx)
    wei = inLayout(full.weiData, full.wei, full.dataPd.weights_desc(), w.f32(),
                   Carver(ws).take(d.weights, full.dataPd.weights_desc()));
  int64_t wn = g.co * g.ckk(), image = g.c * g.h * g.w;
  bool sums = dw || db;
  float* lanes = ws + d.weights;
  forLanes(
      g, d, hasBias, lanes,
      [&](const Prims& p, float* lane, bool firstOfLane, int64_t b0, int64_t n) {
        BackwardLane l(lane, d, p);
        float* dys = dyv.f32() + b0 * g.co * g.plane();
        memory dyd; // dy in the input gradient's layout, kept for the weights' where it is theirs
        if (dx) {
          dyd = inLayout(p.dyIn, p.dst, p.dataPd.diff_dst_desc(), dys, l.dy);
          memory gw = weightsFor(wei, p.weiData, p.wei, p.dataPd.weights_desc(), w, l.wei);
          groupInputGrad(p, l, dyd, gw, dx.p + b0 * image, dx.acc, n * image);
        }
        if (!sums) return;
        // The images in the weights' layout, over dx's blocked buffer (done with).
        memory src = inLayout(p.srcW, p.src, p.weightsPd.src_desc(), x.f32() + b0 * image,
                              Carver(l.in).take(d.in, p.weightsPd.src_desc()));
        memory dyw = dx && dyd.get_desc() == p.weightsPd.diff_dst_desc()
                         ? dyd
                         : inLayout(p.dyW, p.dst, p.weightsPd.diff_dst_desc(), dys,
                                    Carver(l.dy).take(d.out, p.weightsPd.diff_dst_desc()));
        groupWeightGrad(p, l, src, dyw, hasBias, firstOfLane, wn, d.sums);
      });
  if (!sums) return;
  // 3. The lanes' sums in lane order, whatever thread ran each.
  int64_t laneCount = d.lanes, stride = d.laneFloats, at = d.laneFloats - d.sums;
  parallelFor(d.sums, kParallelMin / std::max<int64_t>(laneCount, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t e = lo; e < hi; ++e) {
      bool weight = e < wn;
      const GradOut& out = weight ? dw : db;
      if (!out) continue;
      float s = 0.f;
      for (int64_t lane = 0; lane < laneCount; ++lane)
        s += lanes[lane * stride + at + e];
      out.put(weight ? e : e - wn, s);
    }
  });
}

} // namespace

bool convDirectInUse() {
  return directWanted();
}

bool convDirect(const KernelCall& c, bool hasBias) {
  if (!directWanted()) return false;
  const TensorView& x = c.in[c.backward ? 1 : 0];
  const TensorView& w = c.in[c.backward ? 2 : 1];
  Geometry g = convGeometry(c, x, w);
  ir::ConvDirectPlan d = ir::convDirectPlan(g.b, g.c, g.h, g.w, g.co, g.k, g.plane(), c.backward);
  if (!d.taken) return false;
  try {
    if (c.backward)
      backward(c, g, d, hasBias);
    else
      forward(c, g, d, hasBias);
  } catch (const dnnl::error& e) {
    failed(e);
  }
  return true;
}

#endif

} // namespace epl::backend::cpu
