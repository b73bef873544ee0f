// conv2d (NCHW, square kernel, stride, zero padding) as im2col + one sgemm per group of
// images, where oneDNN's direct convolution is not taken (ConvDirect.h: a build without
// oneDNN, or EPL_CPU_CONV=im2col). Groups have a fixed size (from the shapes alone), and the
// weight gradient adds the groups in order, so the result does not depend on the thread count.
//
// Forward, per group of G images:  col [CKK, G*P] = im2col(x);  tmp [Co, G*P] = W col;
//                                  y[b, co] = tmp[co, b] + bias[co].
// Backward, per group:  dY [Co, G*P] gathered from dy;  db += row sums of dY;
//                       dW += dY col^T;  dcol = W^T dY;  dx += col2im(dcol).
//
// Shape legend: B batch, C input channels, Co output channels, H, W input height and
// width, K kernel, Ho, Wo output height and width, P = Ho*Wo, G images in a group,
// CKK = C*K*K.
#include "backend/KernelShapes.h"
#include "backend/cpu/ConvDirect.h"
#include "backend/cpu/KernelUtil.h"
#include "backend/cpu/Kernels.h"
#include "backend/cpu/Lanes.h"

#include <algorithm>

namespace epl::backend::cpu {

namespace {

using Geometry = ConvGeometry;

// The output columns [lo, hi) whose input column ow s - pad + j lies inside the image, for
// kernel column j; the others read the zero padding.
struct Columns {
  int64_t lo, hi;
};
Columns insideColumns(const Geometry& g, int64_t j) {
  auto ceilDiv = [](int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; };
  int64_t hi = std::min(g.wo, ceilDiv(g.w + g.pad - j, g.stride));
  return {std::min(hi, ceilDiv(g.pad - j, g.stride)), hi};
}

// im2col's plane for kernel offset (i, j) where the stride is 1 and the output as wide as the
// input: output element d is input element d + shift, shift = (i - pad) W + j - pad, but in the
// rows above and below the image and in each row's columns outside it, which are 0. So: one copy of
// the plane's rows inside the image (where rows of a few dozen floats each took their own copy),
// then the zeros over what it carried across a row's edge.
void shiftedPlane(const Geometry& g, const float* src, int64_t i, int64_t j, float* dst) {
  int64_t w = g.w;
  Columns in = insideColumns(g, j);
  int64_t top = std::clamp<int64_t>(g.pad - i, 0, g.ho);
  int64_t bottom = std::clamp<int64_t>(g.h + g.pad - i, top, g.ho);
  int64_t shift = (i - g.pad) * w + j - g.pad;
  std::fill(dst, dst + top * w, 0.f);
  std::fill(dst + bottom * w, dst + g.ho * w, 0.f);
  // The copy, kept inside the input plane and the rows [top, bottom); what it leaves out lies
  // outside the image's columns.
  int64_t from = std::clamp(-shift, top * w, bottom * w);
  int64_t to = std::clamp(g.h * w - shift, from, bottom * w);
  std::fill(dst + top * w, dst + from, 0.f);
  std::copy(src + from + shift, src + to + shift, dst + from);
  std::fill(dst + to, dst + bottom * w, 0.f);
  for (int64_t oh = top; oh < bottom; ++oh) {
    float* row = dst + oh * w;
    for (int64_t ow = 0; ow < in.lo; ++ow)
      row[ow] = 0.f;
    for (int64_t ow = in.hi; ow < w; ++ow)
      row[ow] = 0.f;
  }
}

// col[(c K + i) K + j, n P + oh Wo + ow] = x[b0 + n, c, oh s - pad + i, ow s - pad + j] or 0.
void im2col(const Geometry& g, const float* x, int64_t b0, int64_t nImg, float* col) {
  int64_t rows = g.ckk(), ld = nImg * g.plane();
  parallelFor(rows * nImg, rowGrain(g.plane()), [&](int64_t lo, int64_t hi) {
    for (int64_t rn = lo; rn < hi; ++rn) {
      int64_t r = rn / nImg, n = rn % nImg;
      int64_t ch = r / (g.k * g.k), i = r / g.k % g.k, j = r % g.k;
      const float* src = x + ((b0 + n) * g.c + ch) * g.h * g.w;
      float* dst = col + r * ld + n * g.plane();
      Columns in = insideColumns(g, j);
      if (g.stride == 1 && g.wo == g.w) { // "same" padding: the plane shifted, as one copy
        shiftedPlane(g, src, i, j, dst);
        continue;
      }
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        int64_t ih = oh * g.stride - g.pad + i;
        float* out = dst + oh * g.wo;
        if (ih < 0 || ih >= g.h) {
          std::fill(out, out + g.wo, 0.f);
          continue;
        }
        int64_t base = ih * g.w + j - g.pad; // input column ow s - pad + j of row ih
        // A row is short (an image's width): loops in line, where std::copy and std::fill
        // each called memmove and memset for a few dozen bytes.
        for (int64_t ow = 0; ow < in.lo; ++ow)
          out[ow] = 0.f;
        if (g.stride == 1) {
          const float* row = src + base;
#pragma omp simd
          for (int64_t ow = in.lo; ow < in.hi; ++ow)
            out[ow] = row[ow];
        } else {
          for (int64_t ow = in.lo; ow < in.hi; ++ow)
            out[ow] = src[base + ow * g.stride];
        }
        for (int64_t ow = in.hi; ow < g.wo; ++ow)
          out[ow] = 0.f;
      }
    }
  });
}

// dx[b0 + n, c] (+)= the col rows of channel c scattered back; one thread per (image, channel)
// plane, visiting the kernel offsets in order.
void col2im(const Geometry& g, const float* dcol, int64_t b0, int64_t nImg, const GradOut& dx) {
  int64_t ld = nImg * g.plane();
  parallelFor(nImg * g.c, rowGrain(g.k * g.k * g.plane()), [&](int64_t lo, int64_t hi) {
    for (int64_t nc = lo; nc < hi; ++nc) {
      int64_t n = nc / g.c, ch = nc % g.c;
      float* dst = dx.p + ((b0 + n) * g.c + ch) * g.h * g.w;
      if (!dx.acc) std::fill(dst, dst + g.h * g.w, 0.f);
      for (int64_t i = 0; i < g.k; ++i)
        for (int64_t j = 0; j < g.k; ++j) {
          const float* src = dcol + ((ch * g.k + i) * g.k + j) * ld + n * g.plane();
          Columns in = insideColumns(g, j);
          for (int64_t oh = 0; oh < g.ho; ++oh) {
            int64_t ih = oh * g.stride - g.pad + i;
            if (ih < 0 || ih >= g.h) continue;
            int64_t base = ih * g.w + j - g.pad;
            const float* row = src + oh * g.wo;
            // Each output column adds into its own element: the same sums in the same order.
            // Stride 1 (most convolutions) adds a contiguous row: vector loads and stores,
            // where a stride known only at run time scatters one float at a time.
            if (g.stride == 1) {
              float* out = dst + base;
#pragma omp simd
              for (int64_t ow = in.lo; ow < in.hi; ++ow)
                out[ow] += row[ow];
              continue;
            }
#pragma omp simd
            for (int64_t ow = in.lo; ow < in.hi; ++ow)
              dst[base + ow * g.stride] += row[ow];
          }
        }
    }
  });
}

// in = [x, W [Co, C, K, K], b [Co]?], out = [y [B, Co, Ho, Wo]].
void convForward(const KernelCall& c, bool hasBias) {
  const TensorView &x = c.in[0], &w = c.in[1];
  Geometry g = convGeometry(c, x, w);
  int64_t group = g.group(), p = g.plane();
  int64_t cols = g.ckk() * group * p; // the workspace: col, then tmp (Module::workspaceBytes)
  float *col = workspace(c, 0, 0, cols), *tmp = workspace(c, 1, cols, g.co * group * p);
  const float* bias = hasBias ? c.in[2].f32() : nullptr;
  float* y = c.out[0].f32();
  for (int64_t b0 = 0; b0 < g.b; b0 += group) {
    int64_t n = std::min(group, g.b - b0), ld = n * p;
    im2col(g, x.f32(), b0, n, col);
    gemm(false, false, g.co, ld, g.ckk(), 1.f, w.f32(), g.ckk(), col, ld, 0.f, tmp, ld);
    parallelFor(n * g.co, rowGrain(p), [&](int64_t lo, int64_t hi) {
      for (int64_t ic = lo; ic < hi; ++ic) {
        int64_t i = ic / g.co, co = ic % g.co;
        const float* src = tmp + co * ld + i * p;
        float* dst = y + ((b0 + i) * g.co + co) * p;
        float bv = bias ? bias[co] : 0.f;
        for (int64_t e = 0; e < p; ++e)
          dst[e] = src[e] + bv;
      }
    });
  }
}

// in = [dy, x, W, b?, y], out = [dx, dW, db?].
void convBackward(const KernelCall& c, bool hasBias) {
  const TensorView &dyv = c.in[0], &x = c.in[1], &w = c.in[2];
  Geometry g = convGeometry(c, x, w);
  int64_t group = g.group(), p = g.plane();
  int64_t cols = g.ckk() * group * p, ys = g.co * group * p; // col, dY, dcol
  float *col = workspace(c, 0, 0, cols), *dY = workspace(c, 1, cols, ys),
        *dcol = workspace(c, 2, cols + ys, cols);
  GradOut dx = gradOut(c, 0), dw = gradOut(c, 1), db = hasBias ? gradOut(c, 2) : GradOut{};
  const float* dy = dyv.f32();
  for (int64_t b0 = 0; b0 < g.b; b0 += group) {
    int64_t n = std::min(group, g.b - b0), ld = n * p;
    bool first = b0 == 0;
    parallelFor(g.co * n, rowGrain(p), [&](int64_t lo, int64_t hi) {
      for (int64_t ci = lo; ci < hi; ++ci) {
        int64_t co = ci / n, i = ci % n;
        std::memcpy(dY + co * ld + i * p, dy + ((b0 + i) * g.co + co) * p, sizeof(float) * p);
      }
    });
    // The bias's gradient: each channel's row of dY summed in lanes (Lanes.h: one order
    // for a given length; a plain loop adds one float at a time).
    if (db)
      for (int64_t co = 0; co < g.co; ++co) {
        const float* row = dY + co * ld;
        float s = cpu::laneSum(ld, [&](int64_t e) { return row[e]; });
        db.p[co] = (first && !db.acc) ? s : db.p[co] + s;
      }
    if (dw) {
      im2col(g, x.f32(), b0, n, col);
      float beta = first ? dw.beta() : 1.f;
      gemm(false, true, g.co, g.ckk(), ld, 1.f, dY, ld, col, ld, beta, dw.p, g.ckk());
    }
    if (dx) {
      gemm(true, false, g.ckk(), ld, g.co, 1.f, w.f32(), g.ckk(), dY, ld, 0.f, dcol, ld);
      col2im(g, dcol, b0, n, dx);
    }
  }
}

} // namespace

void conv2d(const KernelCall& c) {
  bool hasBias = attrBool(c, "bias");
  if (convDirect(c, hasBias)) return;
  if (!c.backward) return convForward(c, hasBias);
  convBackward(c, hasBias);
}

} // namespace epl::backend::cpu
