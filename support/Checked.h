// Exact 64-bit size arithmetic. Every size EPL computes (dims, element and byte counts,
// parameter totals) goes through these, so a size past 2^63 - 1 is reported, never wrapped.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace epl {

inline std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> checkedSub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> checkedMul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of all factors, or nullopt when it does not fit.
inline std::optional<int64_t> checkedProduct(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  return r;
}

} // namespace epl
