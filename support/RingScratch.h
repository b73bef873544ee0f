// The scratch memory of a ring reduction (backend/comm/MpiRing.cpp), in one place for the
// ring that takes it and the memory plan that counts it (passes/MemoryPlan.cpp).
#pragma once
#include <algorithm>
#include <cstdint>

namespace epl::ring {

// Segments of at most 1 MiB travel the ring; kWindow received segments of the reduce steps
// are in flight at once.
constexpr int64_t kSegmentBytes = int64_t{1} << 20;
constexpr int64_t kWindow = 4;

// Elements of one segment: the largest block's, at most a segment's worth.
inline int64_t segmentElements(int64_t largestBlock, int64_t elementBytes) {
  return std::min<int64_t>(std::max<int64_t>(largestBlock, 1), kSegmentBytes / elementBytes);
}

// What a reduction of `total` elements among `ranks`, in blocks of at most `largestBlock`,
// takes: the window, and unless the sums are f32 landing in place in the input, the whole
// reduction in the wire type. Nothing for one rank.
inline int64_t scratchBytes(int ranks, int64_t total, int64_t largestBlock, int64_t elementBytes,
                            bool inPlaceF32) {
  if (ranks < 2 || total == 0) return 0;
  int64_t window = kWindow * segmentElements(largestBlock, elementBytes) * elementBytes;
  return window + (inPlaceF32 ? 0 : total * elementBytes);
}

} // namespace epl::ring
