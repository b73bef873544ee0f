// Seeded randomness that gives the same numbers on every machine and build: the splitmix64
// finaliser, and a seed mixed from several words (run seed, step, op, …).
#pragma once
#include <cstdint>
#include <initializer_list>

namespace epl {

// splitmix64's output function of x + golden ratio: a bijection with good avalanche.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One well-mixed seed from several words, order-sensitive.
inline uint64_t mixSeeds(std::initializer_list<uint64_t> words) {
  uint64_t h = 0;
  for (uint64_t w : words)
    h = splitmix64(h ^ splitmix64(w));
  return h;
}

} // namespace epl
