// fp8 and int8 codes (src/core/half, src/quant/fp8): every code of both fp8
// formats, a table of edge cases derived by hand from the format definitions,
// a dense sweep against a nearest-value oracle, int8 rounding and clamping,
// and buffer quantize/dequantize per tensor and per channel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/half.hpp"
#include "graph_test_util.hpp"
#include "quant/fp8.hpp"

namespace kiln {
namespace {

using quant::Int8Range;

// Value of an fp8 code straight from the definition: bias 2^(e-1) - 1,
// subnormals at exponent field 0. Special codes are not asked for here.
double by_definition(uint8_t c, int exp_bits, int man_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int field = (c >> man_bits) & ((1 << exp_bits) - 1);
  const int man = c & ((1 << man_bits) - 1);
  const double v = field == 0 ? std::ldexp(man, 1 - bias - man_bits) : std::ldexp((1 << man_bits) + man, field - bias - man_bits);
  return (c & 0x80) ? -v : v;
}

bool e4m3_is_nan(uint8_t c) { return (c & 0x7f) == 0x7f; }
bool e5m2_is_nan(uint8_t c) { return (c & 0x7f) > 0x7c; }

struct Format {
  const char* name;
  int exp_bits, man_bits;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
  bool (*is_nan)(uint8_t);
  bool has_inf;  // e5m2: S.11111.00
};
const Format kFormats[] = {{"e4m3", 4, 3, f32_to_e4m3, e4m3_to_f32, e4m3_is_nan, false},
                           {"e5m2", 5, 2, f32_to_e5m2, e5m2_to_f32, e5m2_is_nan, true}};

TEST(Fp8, EveryCodeDecodesByDefinitionAndReencodesToItself) {
  for (const Format& f : kFormats)
    for (int i = 0; i < 256; ++i) {
      const uint8_t c = static_cast<uint8_t>(i);
      const float v = f.decode(c);
      if (f.is_nan(c)) {
        EXPECT_TRUE(std::isnan(v)) << f.name << " " << i;
        EXPECT_TRUE(f.is_nan(f.encode(v))) << f.name << " " << i;  // NaN stays NaN
        continue;
      }
      if (f.has_inf && (c & 0x7f) == 0x7c) EXPECT_TRUE(std::isinf(v)) << f.name << " " << i;
      else EXPECT_EQ(static_cast<double>(v), by_definition(c, f.exp_bits, f.man_bits)) << f.name << " " << i;
      EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << f.name << " " << i;  // 0x80 is -0
      EXPECT_EQ(f.encode(v), c) << f.name << " " << i;
    }
}

// Hand-derived from the definitions (e4m3: bias 7, 3 mantissa bits, no inf,
// S.1111.111 NaN; e5m2: bias 15, 2 mantissa bits, IEEE specials).
TEST(Fp8, KnownDecodedValues) {
  struct Row {
    uint8_t code;
    float e4m3, e5m2;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Row rows[] = {
      {0x00, 0.0f, 0.0f},
      {0x01, 0.001953125f, 1.52587890625e-05f},   // smallest subnormals 2^-9, 2^-16
      {0x03, 0.005859375f, 4.57763671875e-05f},   // largest e5m2 subnormal 3 * 2^-16
      {0x04, 0.0078125f, 6.103515625e-05f},       // e5m2 smallest normal 2^-14
      {0x07, 0.013671875f, 1.068115234375e-04f},  // largest e4m3 subnormal 7 * 2^-9
      {0x08, 0.015625f, 1.220703125e-04f},        // e4m3 smallest normal 2^-6
      {0x30, 0.5f, 0.125f},
      {0x38, 1.0f, 0.5f},
      {0x3c, 1.5f, 1.0f},
      {0x3e, 1.75f, 1.5f},
      {0x40, 2.0f, 2.0f},
      {0x77, 240.0f, 28672.0f},
      {0x7b, 352.0f, 57344.0f},  // e5m2 max finite 1.75 * 2^15
      {0x7c, 384.0f, inf},
      {0x7e, 448.0f, NAN},  // e4m3 max finite 1.75 * 2^8
      {0xb8, -1.0f, -0.5f},
      {0xfe, -448.0f, NAN},
  };
  for (const Row& r : rows) {
    const float a = e4m3_to_f32(r.code), b = e5m2_to_f32(r.code);
    EXPECT_EQ(a, r.e4m3) << std::hex << int(r.code);
    if (std::isnan(r.e5m2)) EXPECT_TRUE(std::isnan(b)) << std::hex << int(r.code);
    else EXPECT_EQ(b, r.e5m2) << std::hex << int(r.code);
  }
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)) && e4m3_to_f32(0x80) == 0.0f);
  EXPECT_TRUE(std::signbit(e5m2_to_f32(0x80)) && e5m2_to_f32(0x80) == 0.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)) && std::isnan(e4m3_to_f32(0xff)));
  EXPECT_EQ(e5m2_to_f32(0xfc), -inf);
}

TEST(Fp8, KnownEncodingsTiesSaturationSubnormalsSigns) {
  const float inf = std::numeric_limits<float>::infinity();
  struct Row {
    float x;
    uint8_t e4m3, e5m2;
    const char* why;
  };
  const Row rows[] = {
      {0.0f, 0x00, 0x00, "zero"},
      {-0.0f, 0x80, 0x80, "negative zero keeps its sign"},
      {1.0f, 0x38, 0x3c, "one"},
      {1.0625f, 0x38, 0x3c, "e4m3 tie 1 | 1.125 -> even mantissa 0"},
      {1.1875f, 0x3a, 0x3d, "e4m3 tie 1.125 | 1.25 -> even (1.25); e5m2 nearest is 1.25"},
      {1.125f, 0x39, 0x3c, "e5m2 tie 1 | 1.25 -> even mantissa 0"},
      {1.375f, 0x3b, 0x3e, "e5m2 tie 1.25 | 1.5 -> even (1.5)"},
      {15.5f, 0x58, 0x4c, "e4m3 tie 15 | 16 carries into the next binade"},
      {448.0f, 0x7e, 0x5f, "e4m3 max"},
      {464.0f, 0x7e, 0x5f, "e4m3 saturates (no 480)"},
      {1e9f, 0x7e, 0x7c, "e4m3 saturates, e5m2 overflows to inf"},
      {inf, 0x7e, 0x7c, "inf: e4m3 saturates, e5m2 keeps inf"},
      {-inf, 0xfe, 0xfc, "-inf"},
      {57344.0f, 0x7e, 0x7b, "e5m2 max finite"},
      {61439.0f, 0x7e, 0x7b, "below the e5m2 overflow midpoint"},
      {61440.0f, 0x7e, 0x7c, "e5m2 midpoint 57344 | 65536: tie to even is inf"},
      {0.0009765625f, 0x00, 0x14, "2^-10: e4m3 tie 0 | 2^-9 -> 0"},
      {0.0029296875f, 0x02, 0x1a, "3 * 2^-10: e4m3 tie 1 | 2 (x 2^-9) -> 2"},
      {0.0146484375f, 0x08, 0x24, "7.5 * 2^-9: e4m3 tie largest subnormal | smallest normal -> normal; e5m2 tie 1.75 | 2 (x 2^-7) -> 2"},
      {7.62939453125e-06f, 0x00, 0x00, "2^-17: e5m2 tie 0 | 2^-16 -> 0"},
      {2.288818359375e-05f, 0x00, 0x02, "3 * 2^-17: e5m2 tie 1 | 2 (x 2^-16) -> 2"},
      {-0.001953125f, 0x81, 0x98, "negative subnormal"},
      {1e-30f, 0x00, 0x00, "underflow to zero"},
      {-1e-30f, 0x80, 0x80, "underflow to negative zero"},
      {FLT_TRUE_MIN, 0x00, 0x00, "f32 subnormal"},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(int(f32_to_e4m3(r.x)), int(r.e4m3)) << r.x << " e4m3: " << r.why;
    EXPECT_EQ(int(f32_to_e5m2(r.x)), int(r.e5m2)) << r.x << " e5m2: " << r.why;
  }
  EXPECT_EQ(f32_to_e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-NAN), 0xff);
  EXPECT_EQ(f32_to_e5m2(NAN), 0x7f);
  EXPECT_EQ(f32_to_e5m2(-NAN), 0xff);
}

// Value of a code of format f by definition (finite codes only).
double value_of(const Format& f, int code) { return by_definition(static_cast<uint8_t>(code), f.exp_bits, f.man_bits); }

// Nearest representable value, ties to the even code (even mantissa): the
// rounding rule itself, evaluated by search over the decoded codes.
uint8_t oracle(const Format& f, float x) {
  const double a = std::fabs(static_cast<double>(x));
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const int max_code = f.has_inf ? 0x7b : 0x7e;
  if (f.has_inf && a >= 61440.0) return sign | 0x7c;
  if (a >= value_of(f, max_code)) return static_cast<uint8_t>(sign | max_code);
  int lo = 0;
  while (value_of(f, lo + 1) <= a) ++lo;
  const double dl = a - value_of(f, lo), dh = value_of(f, lo + 1) - a;
  const int pick = dl < dh ? lo : dh < dl ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return static_cast<uint8_t>(sign | pick);
}

// Every midpoint between neighbouring codes and one f32 ulp either side (where
// rounding decides), plus a strided sweep over all f32 bit patterns. The full
// 2^32 sweep against this oracle was run once when the encoder was written.
TEST(Fp8, MatchesNearestEvenOracleAtEveryMidpointAndOnASweep) {
  for (const Format& f : kFormats) {
    std::vector<float> xs;
    for (int c = 0; c < (f.has_inf ? 0x7b : 0x7e); ++c) {
      const double mid = (value_of(f, c) + value_of(f, c + 1)) / 2;
      const float m = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(m), mid);  // midpoints are exact in f32
      xs.insert(xs.end(), {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY)});
    }
    for (uint64_t u = 0; u < 0x100000000ull; u += 65521) xs.push_back(bits_f32(static_cast<uint32_t>(u)));
    for (float x : xs) {
      if (std::isnan(x)) continue;
      for (float s : {x, -x}) ASSERT_EQ(int(f.encode(s)), int(oracle(f, s))) << f.name << " " << s;
    }
  }
}

TEST(Fp8, TensorsRoundTripThroughBothFormats) {
  const std::vector<float> v = {0.0f, -0.0f, 1.0f, -3.5f, 448.0f, 1000.0f, 0.001953125f};
  const auto a = HostTensor::from_f32_as(DType::F8E4M3, {7}, v).to_f32();
  const auto b = HostTensor::from_f32_as(DType::F8E5M2, {7}, v).to_f32();
  EXPECT_EQ(a, (std::vector<float>{0.0f, -0.0f, 1.0f, -3.5f, 448.0f, 448.0f, 0.001953125f}));
  EXPECT_EQ(b, (std::vector<float>{0.0f, -0.0f, 1.0f, -3.5f, 448.0f, 1024.0f, 0.001953125f}));
}

TEST(Int8, RoundsHalfToEvenAndClampsToTheChosenRange) {
  struct Row {
    float x;
    int narrow, full;
  };
  const Row rows[] = {
      {0.5f, 0, 0},       {1.5f, 2, 2},       {2.5f, 2, 2},           {-0.5f, 0, 0},     {-1.5f, -2, -2},
      {-2.5f, -2, -2},    {126.5f, 126, 126}, {127.4f, 127, 127},     {127.5f, 127, 127}, {200.0f, 127, 127},
      {-127.4f, -127, -127}, {-127.6f, -127, -128}, {-1000.0f, -127, -128}, {INFINITY, 127, 127},
      {-INFINITY, -127, -128}, {NAN, 0, 0},   {0.49999997f, 0, 0},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(quant::f32_to_i8(r.x, Int8Range::Narrow), r.narrow) << r.x;
    EXPECT_EQ(quant::f32_to_i8(r.x, Int8Range::Full), r.full) << r.x;
  }
  for (int c = -128; c <= 127; ++c)  // every int8 code decodes to itself and back
    EXPECT_EQ(quant::encode(DType::I8, quant::decode(DType::I8, static_cast<uint8_t>(c))), static_cast<uint8_t>(c));
}

TEST(QuantScale, AmaxOverCodeMaxWithZeroAndBadInputs) {
  EXPECT_EQ(quant::scale_for_amax(448.0f, DType::F8E4M3), 1.0f);
  EXPECT_EQ(quant::scale_for_amax(2.54f, DType::I8), 2.54f / 127.0f);
  EXPECT_EQ(quant::scale_for_amax(57344.0f, DType::F8E5M2), 1.0f);
  EXPECT_EQ(quant::scale_for_amax(0.0f, DType::F8E4M3), 1.0f);
  EXPECT_EQ(quant::scale_for_amax(1e-44f, DType::F8E4M3), FLT_MIN);
  EXPECT_TRUE(std::isfinite(1.0f / quant::scale_for_amax(1e-44f, DType::I8)));
  EXPECT_THROW(quant::scale_for_amax(-1.0f, DType::I8), Error);
  EXPECT_THROW(quant::scale_for_amax(NAN, DType::I8), Error);
  EXPECT_THROW(quant::scale_for_amax(INFINITY, DType::I8), Error);
  EXPECT_NE(testing::error_of([] { quant::code_max(DType::F16); }).find("f16 is not a code type"), std::string::npos);
}

TEST(QuantValue, MultipliesByTheF32ReciprocalAndSaturates) {
  const float s = 0.1f;
  const float inv = 1.0f / s;
  for (float x : {0.0f, 0.05f, 0.15f, 1.0f, -7.3f, 12.7f, 44.8f, 100.0f}) {
    EXPECT_EQ(quant::quantize_value(x, s, DType::I8, Int8Range::Full), static_cast<uint8_t>(quant::f32_to_i8(x * inv, Int8Range::Full)));
    EXPECT_EQ(quant::quantize_value(x, s, DType::F8E4M3, Int8Range::Full), f32_to_e4m3(x * inv));
  }
  EXPECT_EQ(quant::fake_quantize(100.0f, s, DType::F8E4M3, Int8Range::Full), 448.0f * s);  // saturated
  EXPECT_EQ(quant::fake_quantize(100.0f, s, DType::I8, Int8Range::Full), 127.0f * s);
  EXPECT_EQ(quant::fake_quantize(-100.0f, s, DType::I8, Int8Range::Full), -128.0f * s);
  EXPECT_EQ(quant::fake_quantize(-100.0f, s, DType::I8, Int8Range::Narrow), -127.0f * s);
  // A quantizer saturates e5m2 instead of overflowing to inf.
  EXPECT_EQ(quant::fake_quantize(1e9f, 1.0f, DType::F8E5M2, Int8Range::Full), 57344.0f);
  EXPECT_TRUE(std::isnan(quant::fake_quantize(NAN, 1.0f, DType::F8E4M3, Int8Range::Full)));
}

TEST(QuantBuffer, PerTensorAndPerChannelAlongAnyAxis) {
  // [2, 3, 2]: per channel along axis 1, three scales.
  const Shape shape = {2, 3, 2};
  const std::vector<float> x = {1, -2, 30, 40, 500, -600, 0.5f, 0.25f, -3, 3, 7, 1000};
  QuantParams q;
  q.dtype = DType::I8;
  q.axis = 1;
  q.scales = {1.0f, 0.5f, 10.0f};
  const auto codes = quant::quantize(x.data(), shape, q, Int8Range::Full);
  const std::vector<int8_t> want = {1, -2, 60, 80, 50, -60, 0, 0, -6, 6, 1, 100};  // 0.5 -> 0, 0.25 -> 0: ties/below
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(static_cast<int8_t>(codes[i]), want[i]) << i;
  const auto back = quant::dequantize(codes.data(), shape, q);
  const std::vector<float> want_back = {1, -2, 30, 40, 500, -600, 0, 0, -3, 3, 10, 1000};
  EXPECT_EQ(back, want_back);

  // Per tensor, e4m3: code = e4m3(x / s), real = code * s.
  QuantParams t;
  t.dtype = DType::F8E4M3;
  t.scales = {2.0f};
  const auto c8 = quant::quantize(x.data(), shape, t, Int8Range::Full);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(c8[i], f32_to_e4m3(x[i] * 0.5f)) << i;
    EXPECT_EQ(quant::dequantize(c8.data(), shape, t)[i], e4m3_to_f32(c8[i]) * 2.0f) << i;
  }

  // Tensors: the result holds the codes in q.dtype.
  HostTensor ht = HostTensor::from_f32(shape, x);
  HostTensor qt = quant::quantize_tensor(ht, q, Int8Range::Full);
  EXPECT_EQ(qt.dtype, DType::I8);
  EXPECT_EQ(qt.shape, shape);
  EXPECT_EQ(quant::dequantize_tensor(qt, q), want_back);
  EXPECT_EQ(qt.to_f32()[2], 60.0f);  // HostTensor reads i8 codes as integers
}

TEST(QuantBuffer, RefusesParamsThatDoNotFitNamingTheProblem) {
  const std::vector<float> x(6, 1.0f);
  QuantParams q;
  q.dtype = DType::I8;
  q.axis = 1;
  q.scales = {1.0f, 1.0f};
  EXPECT_NE(testing::error_of([&] { quant::quantize(x.data(), {2, 3}, q, Int8Range::Full); }).find("2 scales for axis 1 of extent 3"),
            std::string::npos);
  q.axis = 2;
  EXPECT_NE(testing::error_of([&] { quant::quantize(x.data(), {2, 3}, q, Int8Range::Full); }).find("axis 2 outside"), std::string::npos);
  q.axis = -1;
  q.scales = {0.0f};
  EXPECT_NE(testing::error_of([&] { quant::dequantize(nullptr, {2, 3}, q); }).find("positive and finite"), std::string::npos);
  q.scales = {1.0f};
  q.dtype = DType::F16;
  EXPECT_NE(testing::error_of([&] { quant::quantize(x.data(), {2, 3}, q, Int8Range::Full); }).find("not a code type"), std::string::npos);
}

TEST(QuantWeights, PerOutputChannelAmaxOverCodeMax) {
  // conv weight [3, 2, 1, 2]; channel 2 is all zero.
  const std::vector<float> w = {0.5f, -4.48f, 1, 2, 0.1f, 0.2f, -0.3f, 0.01f, 0, 0, 0, 0};
  const HostTensor t = HostTensor::from_f32({3, 2, 1, 2}, w);
  for (DType code : {DType::F8E4M3, DType::I8}) {
    const QuantParams q = quant::weight_quant(t, code);
    EXPECT_EQ(q.axis, 0);
    EXPECT_EQ(q.dtype, code);
    ASSERT_EQ(q.scales.size(), 3u);
    EXPECT_EQ(q.scales[0], 4.48f / quant::code_max(code));
    EXPECT_EQ(q.scales[1], 0.3f / quant::code_max(code));
    EXPECT_EQ(q.scales[2], 1.0f);
    // The channel amax lands on the largest code; int8 weights stay within [-127, 127].
    const auto codes = quant::quantize(w.data(), t.shape, q, Int8Range::Narrow);
    EXPECT_EQ(quant::decode(code, codes[1]), -quant::code_max(code));
    EXPECT_EQ(quant::decode(code, codes[6]), -quant::code_max(code));
    for (size_t i = 8; i < 12; ++i) EXPECT_EQ(quant::decode(code, codes[i]), 0.0f);
  }
  Value wv;
  wv.constant = t;
  EXPECT_EQ(quant::int8_range_for(wv), Int8Range::Narrow);
  EXPECT_EQ(quant::int8_range_for(Value{}), Int8Range::Full);
}

}  // namespace
}  // namespace kiln
