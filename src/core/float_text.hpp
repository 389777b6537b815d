// Compact text for f32 values in JSON (graph.json's quantization scales, the
// bundle's quant_scales.json). nlohmann::json holds numbers as doubles and
// writes the shortest text that reads back as that double; for (double)f that
// is up to 17 digits (0.1f -> 0.10000000149011612). The shortest text that
// reads back as the *f32* (std::to_chars of the float: at most 9 digits),
// parsed as a double, is written as that text, and any reader that rounds the
// number to f32 (json::get<float>) gets f's bits back. Halves the scales' share
// of an 8-bit bundle (part of issue 13's plan-size target).
#pragma once
#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

namespace kiln {

inline double shortest_f32(float f) {
  char buf[48];
  const auto r = std::to_chars(buf, buf + sizeof(buf) - 1, f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

inline std::vector<double> shortest_f32(const std::vector<float>& v) {
  std::vector<double> out;
  out.reserve(v.size());
  for (float f : v) out.push_back(shortest_f32(f));
  return out;
}

}  // namespace kiln
