// Memory-bound elementwise and layout ops. Single-threaded: at the sizes of
// vision networks they run at memory bandwidth, which one core nearly
// saturates, and they take no pool so callers can use them anywhere.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.hpp"
#include "core/error.hpp"

namespace kiln::cpu {

namespace {

// The switch sits outside the loop so each case is a tight loop the compiler
// can vectorise (apply_activation per element would branch every time).
template <typename Src>
void apply_loop(int64_t count, Src src, Activation act, float* y) {
  switch (act) {
    case Activation::None:
      for (int64_t i = 0; i < count; ++i) y[i] = src(i);
      break;
    case Activation::Relu:
      for (int64_t i = 0; i < count; ++i) {
        const float v = src(i);
        y[i] = v > 0.f ? v : 0.f;
      }
      break;
    case Activation::Relu6:
      for (int64_t i = 0; i < count; ++i) y[i] = std::min(std::max(src(i), 0.f), 6.f);
      break;
    case Activation::Silu:
      for (int64_t i = 0; i < count; ++i) y[i] = apply_activation(Activation::Silu, src(i));
      break;
    case Activation::Sigmoid:
      for (int64_t i = 0; i < count; ++i) y[i] = apply_activation(Activation::Sigmoid, src(i));
      break;
    case Activation::Gelu:
      for (int64_t i = 0; i < count; ++i) y[i] = apply_activation(Activation::Gelu, src(i));
      break;
    default: fail_unknown_activation(act, "cpu elementwise");
  }
}

}  // namespace

void add(int64_t count, const float* a, const float* b, Activation act, float* y) {
  apply_loop(count, [=](int64_t i) { return a[i] + b[i]; }, act, y);
}

void activation(int64_t count, const float* x, Activation act, float* y) {
  if (act == Activation::None) {
    if (x != y) std::memmove(y, x, size_t(count) * sizeof(float));
    return;
  }
  apply_loop(count, [=](int64_t i) { return x[i]; }, act, y);
}

void inverse_sigmoid(int64_t count, const float* x, float eps, float* y) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    if (std::isnan(v)) {
      y[i] = v;
      continue;
    }
    const float c = std::min(std::max(v, 0.f), 1.f);
    y[i] = std::log(std::max(c, eps) / std::max(1.f - c, eps));
  }
}

void mul_channel(int n, int c, int hw, const float* x, const float* s, float* y) {
  const int64_t planes = int64_t(n) * c;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float k = s[pl];
    const float* src = x + pl * hw;
    float* dst = y + pl * hw;
    for (int i = 0; i < hw; ++i) dst[i] = src[i] * k;
  }
}

void global_avg_pool(int n, int c, int hw, const float* x, float* y) {
  if (hw < 1) fail_runtime("global_avg_pool: empty spatial extent");
  const int64_t planes = int64_t(n) * c;
  for (int64_t pl = 0; pl < planes; ++pl) {
    // Double accumulation: this is the reference backend, and a float sum
    // over large planes drifts measurably.
    const float* src = x + pl * hw;
    double sum = 0.0;
    for (int i = 0; i < hw; ++i) sum += src[i];
    y[pl] = float(sum / hw);
  }
}

void concat_channels(int n, int hw, const std::vector<std::pair<const float*, int>>& inputs, float* y) {
  int c_total = 0;
  for (const auto& in : inputs) {
    if (in.second < 0) fail_runtime("concat_channels: negative channel count");
    c_total += in.second;
  }
  // Per batch item each input contributes one contiguous block of c*hw.
  for (int b = 0; b < n; ++b) {
    float* dst = y + int64_t(b) * c_total * hw;
    for (const auto& [ptr, ch] : inputs) {
      const int64_t block = int64_t(ch) * hw;
      if (block > 0) std::memcpy(dst, ptr + b * block, size_t(block) * sizeof(float));
      dst += block;
    }
  }
}

void slice_channels(int n, int c_total, int hw, int c_begin, int c_count, const float* x, float* y) {
  if (c_begin < 0 || c_count < 0 || c_begin + c_count > c_total)
    fail_runtime("slice_channels: [", c_begin, ", ", c_begin + c_count, ") outside ", c_total, " channels");
  const int64_t block = int64_t(c_count) * hw;
  if (block == 0) return;
  for (int b = 0; b < n; ++b)
    std::memcpy(y + b * block, x + (int64_t(b) * c_total + c_begin) * hw, size_t(block) * sizeof(float));
}

}  // namespace kiln::cpu
