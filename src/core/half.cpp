#include "core/half.hpp"

#include <cmath>

namespace kiln {

uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);  // underflows to zero
    // Subnormal half: shift the implicit-1 mantissa, round to nearest even.
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  // A carry out of the mantissa correctly bumps the exponent (up to inf).
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

uint8_t f32_to_e4m3(float f) {
  uint32_t x = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  if (std::isnan(f)) return static_cast<uint8_t>(sign | 0x7fu);
  float a = std::fabs(f);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7eu);  // saturate
  if (a < std::ldexp(1.0f, -10)) {
    // Below half the smallest subnormal (2^-9): rounds to zero, except exact ties handled below.
    return sign;
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // a = 1.xxx * 2^exp
  if (exp < -6) exp = -6;  // subnormal range uses a fixed scale of 2^-9
  float quantum = std::ldexp(1.0f, exp - 3);
  float q = std::nearbyint(a / quantum);  // default rounding mode: nearest even
  float r = q * quantum;
  if (r >= 448.0f) return static_cast<uint8_t>(sign | 0x7eu);
  // Re-encode r exactly.
  if (r < std::ldexp(1.0f, -6)) {
    uint8_t m = static_cast<uint8_t>(r / std::ldexp(1.0f, -9));
    return static_cast<uint8_t>(sign | m);
  }
  int re;
  float rm = std::frexp(r, &re);
  int rexp = re - 1;
  uint8_t mant = static_cast<uint8_t>((rm * 2.0f - 1.0f) * 8.0f);
  return static_cast<uint8_t>(sign | ((rexp + 7) << 3) | mant);
}

float e4m3_to_f32(uint8_t v) {
  bool neg = v & 0x80u;
  uint8_t exp = (v >> 3) & 0xfu;
  uint8_t mant = v & 0x7u;
  float r;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0)
    r = std::ldexp(static_cast<float>(mant), -9);
  else
    r = std::ldexp(1.0f + mant / 8.0f, exp - 7);
  return neg ? -r : r;
}

}  // namespace kiln
