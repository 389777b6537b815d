#include "quant/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "backends/cpu/cpu_backend.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/half.hpp"
#include "quant/fp8.hpp"
#include "quant/strict_json.hpp"

namespace kiln::quant {

using nlohmann::json;

namespace {

// |x| as its f32 bit pattern (sign cleared); non-finite values are refused.
uint32_t magnitude_bits(float x) {
  const uint32_t a = f32_bits(x) & 0x7fffffffu;
  if (a >= 0x7f800000u) fail_input("calibration saw a non-finite value (", x, ")");
  return a;
}

class MaxCollector final : public RangeCollector {
 public:
  int passes() const override { return 1; }
  void observe(const float* x, size_t n) override {
    uint32_t m = max_bits_;
    for (size_t i = 0; i < n; ++i) m = std::max(m, magnitude_bits(x[i]));  // bit order is value order here
    max_bits_ = m;
  }
  void next_pass() override { fail_runtime("max calibration has one pass"); }
  float amax() const override { return bits_f32(max_bits_); }

 private:
  uint32_t max_bits_ = 0;
};

// Nearest rank: the ceil(p/100 * n)-th smallest of n, within [1, n]. The
// small slack keeps p * n that should be an integer (99.99% of 10^4) from
// rounding up past it.
uint64_t nearest_rank(double p, uint64_t n) {
  const long double r = static_cast<long double>(p) / 100.0L * static_cast<long double>(n);
  const uint64_t k = static_cast<uint64_t>(std::ceil(r - 1e-9L * std::max<long double>(1.0L, r)));
  return std::clamp<uint64_t>(k, 1, n);
}

class PercentileCollector final : public RangeCollector {
 public:
  explicit PercentileCollector(double p) : p_(p), top_(kTopBins, 0) {
    if (!(p > 0 && p <= 100)) fail_usage("percentile calibration: percentile ", p, " outside (0, 100]");
  }
  int passes() const override { return 2; }
  void observe(const float* x, size_t n) override {
    if (pass_ == 0) {
      for (size_t i = 0; i < n; ++i) ++top_[magnitude_bits(x[i]) >> kLowBits];
      count_ += n;
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      const uint32_t a = magnitude_bits(x[i]);
      if ((a >> kLowBits) == bin_) ++low_[a & ((1u << kLowBits) - 1)];
    }
  }
  void next_pass() override {
    if (pass_ != 0) fail_runtime("percentile calibration has two passes");
    pass_ = 1;
    if (count_ == 0) return;
    uint64_t k = nearest_rank(p_, count_), seen = 0;
    for (bin_ = 0; seen + top_[bin_] < k; ++bin_) seen += top_[bin_];
    rank_in_bin_ = k - seen;  // 1-based within the bin
    low_.assign(size_t{1} << kLowBits, 0);
  }
  float amax() const override {
    if (count_ == 0) return 0.0f;
    if (pass_ != 1) fail_runtime("percentile calibration: amax asked before its second pass");
    uint64_t seen = 0;
    for (uint32_t lo = 0; lo < low_.size(); ++lo) {
      seen += low_[lo];
      if (seen >= rank_in_bin_) return bits_f32((bin_ << kLowBits) | lo);
    }
    fail_runtime("percentile calibration: the second pass saw other data than the first");
  }

 private:
  static constexpr int kLowBits = 15;                            // bits 14..0 of |x|
  static constexpr size_t kTopBins = size_t{1} << (31 - kLowBits);  // bits 30..15
  double p_;
  int pass_ = 0;
  uint64_t count_ = 0, rank_in_bin_ = 0;
  uint32_t bin_ = 0;
  std::vector<uint64_t> top_, low_;
};

enum class Threshold { Entropy, Mse };

// Pass 1: amax. Pass 2: counts of 0 < |x| <= amax in `bins` equal bins.
class HistogramCollector final : public RangeCollector {
 public:
  HistogramCollector(Threshold how, DType code, int bins) : how_(how), code_(code), bins_(bins) {
    code_max(code);  // refuses a non-code type
    if (bins < 1) fail_usage("histogram calibration: ", bins, " bins");
  }
  int passes() const override { return 2; }
  void observe(const float* x, size_t n) override {
    if (pass_ == 0) return max_.observe(x, n);
    if (counts_.empty()) return;
    const float inv = static_cast<float>(bins_) / amax_;
    for (size_t i = 0; i < n; ++i) {
      const float a = bits_f32(magnitude_bits(x[i]));
      if (a == 0) continue;
      if (a > amax_) fail_runtime("histogram calibration: the second pass saw other data than the first");
      ++counts_[std::min<size_t>(static_cast<size_t>(a * inv), counts_.size() - 1)];
    }
  }
  void next_pass() override {
    if (pass_ != 0) fail_runtime("histogram calibration has two passes");
    pass_ = 1;
    amax_ = max_.amax();
    if (amax_ > 0) counts_.assign(static_cast<size_t>(bins_), 0);
  }
  float amax() const override {
    if (pass_ != 1) fail_runtime("histogram calibration: amax asked before its second pass");
    if (counts_.empty()) return 0.0f;
    const float width = amax_ / static_cast<float>(bins_);
    return how_ == Threshold::Entropy ? entropy_threshold(counts_, width, code_) : mse_threshold(counts_, width, code_);
  }

 private:
  Threshold how_;
  DType code_;
  int bins_, pass_ = 0;
  MaxCollector max_;
  float amax_ = 0;
  std::vector<uint64_t> counts_;
};

float bin_centre(size_t j, float width) { return (static_cast<float>(j) + 0.5f) * width; }

}  // namespace

std::unique_ptr<RangeCollector> make_max_collector() { return std::make_unique<MaxCollector>(); }
std::unique_ptr<RangeCollector> make_percentile_collector(double p) { return std::make_unique<PercentileCollector>(p); }
std::unique_ptr<RangeCollector> make_entropy_collector(DType code, int bins) {
  return std::make_unique<HistogramCollector>(Threshold::Entropy, code, bins);
}
std::unique_ptr<RangeCollector> make_mse_collector(DType code, int bins) {
  return std::make_unique<HistogramCollector>(Threshold::Mse, code, bins);
}

std::unique_ptr<RangeCollector> make_collector(const CalibSettings& s, DType code) {
  switch (s.method) {
    case CalibMethod::Max: return make_max_collector();
    case CalibMethod::Percentile: return make_percentile_collector(s.percentile);
    case CalibMethod::Entropy: return make_entropy_collector(code);
    case CalibMethod::Mse: return make_mse_collector(code);
    default: fail_runtime("calibration method ", static_cast<int>(s.method), " has no collector");
  }
}

// Entropy calibration, after TensorRT's method, in kiln's words:
//   The histogram H of |x| has B bins of width w over [0, amax]. Each
//   candidate threshold t = i*w (i = 128..B: at least as many bins as int8
//   has positive levels) is scored by how much information quantizing with
//   it loses. The reference distribution P is H's first i bins with every
//   count beyond t added to bin i-1 (what saturation does to those values).
//   The candidate distribution Q is what the codes keep of the unclipped
//   bins H[0..i): bins whose centres get the same code at scale t / code_max
//   form one group, and each group's H total is spread evenly over those of
//   its bins where P is non-zero (bins empty in P stay empty in Q). Both are
//   normalized to sum 1. Because Q leaves the clipped counts out, clipping
//   shows up as P piling mass into bin i-1 that Q does not have. Where P > 0
//   but Q = 0 (clipped counts landing in a group that H leaves empty, e.g.
//   an isolated outlier beyond a gap) Q is floored at 1e-4, as the MXNet and
//   TensorRT implementations smooth it, so a far outlier does not force t to
//   amax. The score is the Kullback-Leibler divergence KL(P || Q) = sum
//   P log(P / Q) over bins with P > 0; the smallest score wins, the first
//   (smallest t) on ties.
//   TensorRT groups the i bins into 128 equal runs; grouping by the actual
//   code of each bin centre is the same for int8 and also serves e4m3, whose
//   levels are not evenly spaced.
float entropy_threshold(const std::vector<uint64_t>& counts, float width, DType code) {
  constexpr double kFloor = 1e-4;
  const size_t bins = counts.size();
  std::vector<double> above(bins + 1, 0.0);  // above[i] = count in bins >= i
  for (size_t j = bins; j-- > 0;) above[j] = above[j + 1] + static_cast<double>(counts[j]);
  const double total = above[0];
  if (bins == 0 || total == 0) return 0.0f;
  const float qmax = code_max(code);
  double best = std::numeric_limits<double>::infinity();
  size_t best_i = bins;
  std::vector<uint8_t> codes(bins);
  std::vector<double> p(bins), q(bins);
  for (size_t i = std::min<size_t>(128, bins); i <= bins; ++i) {
    const double kept = total - above[i];
    if (kept == 0) continue;  // nothing below t: no distribution to compare
    const float scale = std::max(static_cast<float>(i) * width / qmax, std::numeric_limits<float>::min());
    for (size_t j = 0; j < i; ++j) {
      codes[j] = quantize_value(bin_centre(j, width), scale, code, Int8Range::Full);
      p[j] = static_cast<double>(counts[j]) + (j + 1 == i ? above[i] : 0.0);
    }
    for (size_t j = 0; j < i;) {
      size_t k = j;
      double sum = 0;
      int non_empty = 0;
      for (; k < i && codes[k] == codes[j]; ++k) sum += static_cast<double>(counts[k]), non_empty += p[k] > 0;
      for (size_t m = j; m < k; ++m) q[m] = p[m] > 0 ? sum / non_empty : 0.0;
      j = k;
    }
    double kl = 0;
    for (size_t j = 0; j < i; ++j) {
      if (p[j] == 0) continue;
      const double pn = p[j] / total, qn = q[j] > 0 ? q[j] / kept : kFloor;
      kl += pn * std::log(pn / qn);
    }
    if (kl < best) best = kl, best_i = i;
  }
  return static_cast<float>(best_i) * width;
}

// MSE calibration: the threshold t = i*w (i = 1..B) that minimizes the
// squared error of fake-quantizing every value at scale t / code_max,
// estimated on the histogram with each bin's values at its centre (values
// beyond t saturate at t).
float mse_threshold(const std::vector<uint64_t>& counts, float width, DType code) {
  const size_t bins = counts.size();
  const float qmax = code_max(code);
  double best = std::numeric_limits<double>::infinity();
  size_t best_i = bins;
  for (size_t i = 1; i <= bins; ++i) {
    const float scale = std::max(static_cast<float>(i) * width / qmax, std::numeric_limits<float>::min());
    double err = 0;
    for (size_t j = 0; j < bins && err < best; ++j) {
      if (!counts[j]) continue;
      const float c = bin_centre(j, width);
      const double d = static_cast<double>(c) - fake_quantize(c, scale, code, Int8Range::Full);
      err += static_cast<double>(counts[j]) * d * d;
    }
    if (err < best) best = err, best_i = i;
  }
  return bins ? static_cast<float>(best_i) * width : 0.0f;
}

float ActivationScales::scale(const std::string& value) const {
  const auto it = amax.find(value);
  if (it == amax.end()) fail_usage("activation scales: no scale for value '", value, "'");
  return scale_for_amax(it->second, precision);
}

std::vector<int> calibrated_values(const Graph& g, const std::vector<int>& nodes) {
  std::vector<char> on(g.values.size(), 0);
  for (int i : nodes) {
    const Node& n = g.nodes.at(static_cast<size_t>(i));
    for (int v : n.inputs)
      if (!g.is_constant(v)) on[v] = 1;
    for (int v : n.outputs) on[v] = 1;
  }
  std::vector<int> out;
  for (size_t v = 0; v < on.size(); ++v)
    if (on[v]) out.push_back(static_cast<int>(v));
  return out;
}

namespace {

void run_observed(const Graph& g, const cpu::CpuProgram& prog, const std::vector<std::vector<float>>& inputs,
                  const std::vector<char>& wanted, const ValueObserver& observe) {
  if (inputs.size() != g.inputs.size())
    fail_usage("calibration: ", inputs.size(), " input buffers for a graph of ", g.inputs.size(), " inputs");
  // Last node reading each value: its buffer is freed after that node.
  std::vector<int> last_read(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (int v : g.nodes[i].inputs) last_read[v] = static_cast<int>(i);
  std::vector<std::vector<float>> buf(g.values.size());
  std::vector<float*> ptr(g.values.size(), nullptr);
  auto release = [&](int v) {
    std::vector<float>().swap(buf[v]);
    ptr[v] = nullptr;
  };
  auto written = [&](int v) {
    if (v < static_cast<int>(wanted.size()) && wanted[v]) observe(v, buf[v].data(), buf[v].size());
  };
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    const int v = g.inputs[k];
    const int64_t n = shape_numel(g.values[v].shape);
    if (static_cast<int64_t>(inputs[k].size()) != n)
      fail_usage("calibration: input '", g.values[v].name, "' got ", inputs[k].size(), " values, its shape ",
                 shape_str(g.values[v].shape), " takes ", n);
    buf[v] = inputs[k];
    ptr[v] = buf[v].data();
    written(v);
  }
  cpu::ThreadPool& pool = cpu::default_pool();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (int o : n.outputs) {
      buf[o].assign(static_cast<size_t>(shape_numel(g.values[o].shape)), 0.0f);
      ptr[o] = buf[o].data();
    }
    prog.run_node(g, n, ptr, pool);
    for (int o : n.outputs) {
      written(o);
      if (last_read[o] < 0) release(o);
    }
    for (int v : n.inputs)
      if (!g.is_constant(v) && last_read[v] == static_cast<int>(i)) release(v);
  }
}

}  // namespace

void run_cpu_observed(const Graph& g, const std::vector<std::vector<float>>& inputs, const std::vector<char>& wanted,
                      const ValueObserver& observe) {
  const cpu::CpuProgram prog(g);
  run_observed(g, prog, inputs, wanted, observe);
}

ActivationScales calibrate(const Graph& g, const std::vector<int>& nodes, DType precision, const CalibSettings& settings,
                           const CalibrationData& data, const std::function<void(int64_t, int64_t)>& progress) {
  code_max(precision);
  if (data.batches < 1 || !data.batch) fail_usage("calibration needs at least one batch of inputs");
  const std::vector<int> values = calibrated_values(g, nodes);
  std::vector<char> wanted(g.values.size(), 0);
  std::vector<std::unique_ptr<RangeCollector>> collectors(g.values.size());
  std::map<std::string, int> by_name;
  for (int v : values) {
    if (!by_name.emplace(g.values[v].name, v).second)
      fail_runtime("calibration: two values are named '", g.values[v].name, "' (scales are keyed by value name)");
    wanted[v] = 1;
    collectors[v] = make_collector(settings, precision);
  }
  const int passes = values.empty() ? 0 : collectors[values[0]]->passes();
  const cpu::CpuProgram prog(g);
  int64_t done = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t b = 0; b < data.batches; ++b) {
      run_observed(g, prog, data.batch(b), wanted, [&](int v, const float* x, size_t n) {
        try {
          collectors[v]->observe(x, n);
        } catch (const Error& e) {
          throw Error(e.kind(), cat("calibration batch ", b, ", value '", g.values[v].name, "': ", e.what()));
        }
      });
      if (progress) progress(++done, data.batches * passes);
    }
    if (pass + 1 < passes)
      for (int v : values) collectors[v]->next_pass();
  }
  ActivationScales s;
  s.precision = precision;
  s.settings = settings;
  s.batches = data.batches;
  for (int v : values) s.amax[g.values[v].name] = collectors[v]->amax();
  return s;
}

void check_scales_cover(const Graph& g, const std::vector<int>& nodes, const ActivationScales& s, const std::string& source) {
  for (int i : nodes) {
    const Node& n = g.nodes.at(static_cast<size_t>(i));
    for (int v : calibrated_values(g, {i}))
      if (!s.amax.count(g.values[v].name))
        fail_usage(source, ": no scale for value '", g.values[v].name, "' of quantized layer '", n.name, "'");
  }
}

std::string scales_to_json(const ActivationScales& s) {
  json values = json::object();
  for (const auto& [name, a] : s.amax) values[name] = {{"amax", a}, {"scale", scale_for_amax(a, s.precision)}};
  const json j = {{"format", 1},
                  {"precision", precision_name(s.precision)},
                  {"calibration", calib_settings_to_json(s.settings)},
                  {"batches", s.batches},
                  {"values", values}};
  return j.dump(2) + "\n";
}

ActivationScales parse_scales(const std::string& text, const std::string& source) {
  const json j = parse_json_text(text, source);
  const StrictObject o(j, source, "", {"format", "precision", "calibration", "batches", "values"}, {});
  if (o.integer("format") != 1) o.fail("format", "must be 1 (the only scales format so far)");
  ActivationScales s;
  const std::string precision = o.string("precision");
  if (precision != "fp8" && precision != "int8") o.fail("precision", "must be \"fp8\" or \"int8\", not \"" + precision + "\"");
  s.precision = precision == "fp8" ? DType::F8E4M3 : DType::I8;
  s.settings = calib_settings_from_json(o.at("calibration"), source, "calibration");
  s.batches = o.integer("batches");
  if (s.batches < 1) o.fail("batches", "must be at least 1");
  const json& values = o.at("values");
  if (!values.is_object()) o.fail("values", "must be an object keyed by value name");
  for (const auto& [name, entry] : values.items()) {
    const StrictObject e(entry, source, "values." + name, {"amax", "scale"}, {});
    const double amax = e.number("amax");
    if (amax < 0 || amax > std::numeric_limits<float>::max()) e.fail("amax", "must lie in [0, FLT_MAX]");
    const float a = static_cast<float>(amax);
    if (static_cast<double>(a) != amax) e.fail("amax", "is not an f32 value");
    const float want = scale_for_amax(a, s.precision);
    if (e.number("scale") != static_cast<double>(want))
      e.fail("scale", cat("is ", e.number("scale"), " but amax ", a, " / ", code_max(s.precision), " gives ", want));
    s.amax[name] = a;
  }
  return s;
}

ActivationScales read_scales(const std::string& path) { return parse_scales(read_text_file(path), path); }

void write_scales(const ActivationScales& s, const std::string& path) {
  const std::string text = scales_to_json(s);
  write_file_atomic(path, [&](std::FILE* f) { write_all(f, text.data(), text.size()); });
}

}  // namespace kiln::quant
