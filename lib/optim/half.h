// Scalar bf16 / fp16 <-> fp32 conversions (round to nearest even, NaN kept a NaN, Inf an Inf),
// the baseline kernel's and the reference the vector kernels are tested against.
#pragma once

#include <cstdint>
#include <cstring>

namespace tiermem::optim {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in fp32.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(mag) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) {  // Inf, or NaN made quiet with the top of its payload kept
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (u > 0x7f800000u ? 0x200u | ((u >> 13) & 0x3ffu) : 0u));
  }
  if (u < 0x38800000u) {
    // Below the smallest normal half: adding 0.5f lines the half's subnormal unit (2^-24) up
    // with the float's last mantissa bit, so the float addition does the rounding to even.
    const float r = BitsFloat(u) + 0.5f;
    return static_cast<uint16_t>(sign | (FloatBits(r) - 0x3f000000u));
  }
  // Normal: rebias the exponent and round to nearest even on the 13 dropped bits; a carry
  // runs into the exponent, up to Inf for values from 65520.
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;
  if (u >= 0x0f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (u >> 13));
}

}  // namespace tiermem::optim
