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
inline float foldLanes(float* lane) {
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

} // namespace epl::backend::cpu
