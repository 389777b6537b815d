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

namespace {

// One fp8 format: `exp_bits` exponent bits, `man_bits` mantissa bits, bias
// 2^(exp_bits-1) - 1. `ieee` formats (e5m2) keep the top exponent for inf/NaN;
// the others (e4m3fn) have no inf and only S.1111.111 as NaN.
struct Fp8Format {
  int exp_bits, man_bits;
  bool ieee;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint32_t max_code() const { return ieee ? ((1u << exp_bits) - 2) << man_bits | ((1u << man_bits) - 1) : 0x7eu; }
};
constexpr Fp8Format kE4M3{4, 3, false};
constexpr Fp8Format kE5M2{5, 2, true};

// f32 -> fp8 on integers only: the f32 significand is shifted to the fp8
// quantum of its binade (or the subnormal quantum), rounded to nearest even
// on the dropped bits; a carry out of the mantissa moves to the next binade by
// itself because code = (biased exponent - 1) << man_bits + significand.
// Overflow: e4m3 saturates to 448 (inf too), e5m2 rounds to inf. NaN keeps its
// sign and becomes S.111..1 (0x7f / 0xff), as PyTorch's float8 types do.
uint8_t f32_to_fp8(float f, Fp8Format fmt) {
  const uint32_t x = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const uint32_t overflow = fmt.ieee ? fmt.max_code() + 1 : fmt.max_code();  // inf, or the saturated maximum
  const int field = static_cast<int>(a >> 23);
  const int exp = (field ? field : 1) - 127;  // a = sig * 2^(exp - 23)
  const int emin = 1 - fmt.bias();            // smallest normal exponent of the fp8 format
  if (exp > fmt.bias() + (fmt.ieee ? 0 : 1)) return static_cast<uint8_t>(sign | overflow);
  const uint32_t sig = (a & 0x7fffffu) | (field ? 0x800000u : 0u);
  const int binade = exp > emin ? exp : emin;
  const int shift = (binade - fmt.man_bits) - (exp - 23);  // >= 23 - man_bits
  if (shift >= 25) return sign;                            // below half the smallest subnormal
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  const uint32_t code = (static_cast<uint32_t>(binade + fmt.bias() - 1) << fmt.man_bits) + q;
  return static_cast<uint8_t>(sign | (code > fmt.max_code() ? overflow : code));
}

float fp8_to_f32(uint8_t v, Fp8Format fmt) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t field = (v >> fmt.man_bits) & ((1u << fmt.exp_bits) - 1);
  const uint32_t man = v & ((1u << fmt.man_bits) - 1);
  const uint32_t top = (1u << fmt.exp_bits) - 1;
  if (fmt.ieee ? field == top : (field == top && man == (1u << fmt.man_bits) - 1))
    return bits_f32(sign | (fmt.ieee && man == 0 ? 0x7f800000u : 0x7fc00000u));
  if (field == 0) {  // subnormal: man * 2^(emin - man_bits), exact in f32
    const float m = std::ldexp(static_cast<float>(man), 1 - fmt.bias() - fmt.man_bits);
    return sign ? -m : m;
  }
  return bits_f32(sign | ((field - fmt.bias() + 127) << 23) | (man << (23 - fmt.man_bits)));
}

}  // namespace

uint8_t f32_to_e4m3(float f) { return f32_to_fp8(f, kE4M3); }
float e4m3_to_f32(uint8_t v) { return fp8_to_f32(v, kE4M3); }
uint8_t f32_to_e5m2(float f) { return f32_to_fp8(f, kE5M2); }
float e5m2_to_f32(uint8_t v) { return fp8_to_f32(v, kE5M2); }

}  // namespace kiln
