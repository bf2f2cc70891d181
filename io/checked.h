// Size arithmetic that cannot wrap: every sum, product and round-up of a byte count, offset or
// budget goes through these, and nullopt means "does not fit in 64 bits" (a caller's error).
#pragma once

#include <cstdint>
#include <optional>

namespace tiermem {

// a + b, or nullopt when it wraps.
inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b, or nullopt when it wraps.
inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The smallest multiple of `unit` (> 0, any value) that is >= n, or nullopt when that multiple
// does not fit in 64 bits. (The usual `(n + unit - 1) / unit * unit` wraps to 0 near 2^64.)
inline std::optional<uint64_t> RoundUp(uint64_t n, uint64_t unit) {
  if (unit == 0) return std::nullopt;
  const uint64_t rem = n % unit;
  if (rem == 0) return n;
  return CheckedAdd(n - rem, unit);
}

// ceil(n / unit) for unit > 0; never wraps (0 for unit == 0, which callers never pass).
inline uint64_t DivideRoundingUp(uint64_t n, uint64_t unit) {
  if (unit == 0) return 0;
  return n / unit + (n % unit != 0 ? 1 : 0);
}

// The largest byte count that is also a valid file offset (off_t is signed 64-bit).
inline constexpr uint64_t kMaxFileBytes = static_cast<uint64_t>(INT64_MAX);

}  // namespace tiermem
