// Exact conversions between fp32 and the narrow float formats. Rounding is
// round-to-nearest-even everywhere, matching CUDA's __float2half_rn and
// __float2bfloat16_rn, so the CPU backend reproduces GPU storage bit for bit.
#pragma once
#include "core/dtype.hpp"
#include <cstdint>
#include <cstring>

namespace kiln {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
// OCP FP8, round to nearest even (docs/quantization.md):
// e4m3 ("e4m3fn"): no infinities, saturates at +-448 (inf too), NaN is 0x7f/0xff.
// e5m2: IEEE-like, max finite 57344, |x| >= 61440 rounds to inf, NaN 0x7f/0xff.
uint8_t f32_to_e4m3(float f);
float e4m3_to_f32(uint8_t v);
uint8_t f32_to_e5m2(float f);
float e5m2_to_f32(uint8_t v);

// Round-trip helpers used to emulate narrow storage of fp32 values.
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
// f rounded to what storage of type t keeps (f32 and others: unchanged).
inline float round_to_storage(DType t, float f) {
  return t == DType::F16 ? round_f16(f) : t == DType::BF16 ? round_bf16(f) : f;
}

}  // namespace kiln
