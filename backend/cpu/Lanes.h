// Sums of a row that vectorise in a fixed order, for the CPU kernels (compiled with
// -fopenmp-simd, which this header's loops need).
#pragma once
#include <cstdint>

namespace epl::backend::cpu {

// Sums of a row that vectorise in a fixed order: element j adds into lane j mod kLanes, then
// the lanes add in a fixed tree. One order for a given length, whatever the threads or the
// row's address. (A plain `s += x[j]` loop runs one add at a time: its order is fixed by the
// language.)
constexpr int kLanes = 16;
template <class T> T foldLanes(T* lane) { // float, or double for long rows
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int u = 0; u < width; ++u)
      lane[u] += lane[u + width];
  return lane[0];
}
// step(j, j mod kLanes) for j < n, kLanes at a time in a vectorised loop: for steps that add
// into lane arrays (and write anything else by j).
template <class Step> void inLanes(int64_t n, Step step) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int u = 0; u < kLanes; ++u)
      step(j + u, u);
  for (int u = 0; j < n; ++j, ++u)
    step(j, u);
}
// The sum of term(j) for j < n.
template <class Term> float laneSum(int64_t n, Term term) {
  float lane[kLanes] = {};
  inLanes(n, [&](int64_t j, int u) { lane[u] += term(j); });
  return foldLanes(lane);
}
// The sum of term(j) for j < n, each block of kSumBlock terms in float lanes and the blocks'
// lanes in double: a long row's sum (a vocabulary's exponentials) as accurate as the
// block's, in loops that vectorise.
constexpr int64_t kSumBlock = 1024;
template <class Term> double blockedSum(int64_t n, Term term) {
  double lane[kLanes] = {};
  for (int64_t at = 0; at < n; at += kSumBlock) {
    float part[kLanes] = {};
    int64_t len = n - at < kSumBlock ? n - at : kSumBlock;
    inLanes(len, [&](int64_t j, int u) { part[u] += term(at + j); });
    for (int u = 0; u < kLanes; ++u)
      lane[u] += static_cast<double>(part[u]);
  }
  return foldLanes(lane);
}

// The largest of x[0..n), n >= 1: exact in any order, written as a select, which vectorises
// where a reduction through std::max does not. With a NaN in x it may or may not be NaN
// (a softmax or log-sum-exp of such a row is NaN either way).
inline float rowMaxOf(const float* x, int64_t n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t j = 1; j < n; ++j)
    m = m > x[j] ? m : x[j];
  return m;
}

} // namespace epl::backend::cpu
