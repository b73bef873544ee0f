// The seeded sample order: one pseudo-random permutation per epoch, computed per position.
//
// A permutation of [0, size) that needs no table: a 4-round balanced Feistel network keyed
// by (seed, epoch) permutes [0, 4^h) for the smallest 4^h >= size, and "cycle walking"
// re-applies it until the value lands in [0, size). Since 4^h < 4 * size, that takes under
// four rounds on average, and the result is a permutation of [0, size) (Black & Rogaway,
// "Ciphers with arbitrary finite domains"). Four Feistel rounds over a strong round
// function give a pseudo-random permutation (Luby-Rackoff).
#include "interp/data/Dataset.h"
#include "support/Random.h"

#include <fmt/format.h>

namespace epl::data {

namespace {

constexpr int kRounds = 4;

} // namespace

Sampler::Sampler(int64_t size, uint64_t seed) : size_(size), seed_(seed), halfBits_(1) {
  if (size < 1) throw DataError(fmt::format("the data has {} samples; training needs one", size));
  while ((uint64_t{1} << (2 * halfBits_)) < static_cast<uint64_t>(size))
    ++halfBits_;
}

uint64_t Sampler::permute(uint64_t index, uint64_t epoch) const {
  const uint64_t mask = (uint64_t{1} << halfBits_) - 1;
  const uint64_t key = splitmix64(splitmix64(seed_) ^ epoch);
  uint64_t x = index;
  do {
    uint64_t left = x >> halfBits_, right = x & mask;
    for (int r = 0; r < kRounds; ++r) {
      uint64_t f =
          splitmix64(key ^ splitmix64(right + static_cast<uint64_t>(r) * 0x100000001b3ull)) & mask;
      uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = left << halfBits_ | right;
  } while (x >= static_cast<uint64_t>(size_));
  return x;
}

int64_t Sampler::sampleAt(int64_t position) const {
  int64_t epoch = position / size_;
  return static_cast<int64_t>(
      permute(static_cast<uint64_t>(position % size_), static_cast<uint64_t>(epoch)));
}

std::vector<int64_t> Sampler::globalBatch(int64_t step, int64_t batch) const {
  std::vector<int64_t> ids(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i)
    ids[static_cast<size_t>(i)] = sampleAt(step * batch + i);
  return ids;
}

int64_t Sampler::epochOf(int64_t step, int64_t batch) const {
  return step * batch / size_;
}

} // namespace epl::data
