// Dropout's mask: a counter-based hash of (seed, element index), so the forward and its
// backward, every thread count and every device (the CPU and CUDA kernels include this
// header) keep the same elements without storing a mask.
#pragma once
#include "backend/HostDevice.h"

#include <cmath>
#include <cstdint>

namespace epl::backend {

EPL_HOST_DEVICE inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

struct DropoutMask {
  uint32_t k1, k2, threshold; // keep element i iff hash(i) >> 8 >= threshold
  float keepScale;
  DropoutMask(uint64_t seed, double p) { // on the host; the mask is copied to the kernel
    k1 = mix32(static_cast<uint32_t>(seed) ^ 0x9e3779b9U);
    k2 = mix32(static_cast<uint32_t>(seed >> 32) + k1);
    threshold = static_cast<uint32_t>(std::llround(p * 16777216.0));
    keepScale = static_cast<float>(1.0 / (1.0 - p));
  }
  EPL_HOST_DEVICE float factor(int64_t i) const {
    uint32_t lo = static_cast<uint32_t>(i), hi = static_cast<uint32_t>(i >> 32);
    uint32_t h = mix32(mix32(lo ^ k1 ^ (hi * 0x85ebca6bU)) + k2);
    return (h >> 8) >= threshold ? keepScale : 0.f;
  }
};

} // namespace epl::backend
