// Activation range calibration (issue #13): collectors that watch the f32
// values of one activation batch by batch and give its amax (max, percentile,
// entropy, MSE); a CPU run of a graph that feeds every activation a set of
// quantized nodes reads or writes to its collector; and the scales file
// (JSON keyed by value name). Scales are static per tensor: amax / 448 (fp8
// e4m3) or / 127 (int8). docs/quantization.md describes each method.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "quant/recipe.hpp"

namespace kiln::quant {

// One activation's range. Some methods need two passes over the calibration
// data: the first finds what the second bins (percentile: the exact order
// statistic; entropy and MSE: a 2048-bin histogram over [0, amax]).
// Non-finite values are refused with Error(Input).
class RangeCollector {
 public:
  virtual ~RangeCollector() = default;
  virtual int passes() const = 0;
  virtual void observe(const float* x, size_t n) = 0;  // a batch of the current pass
  virtual void next_pass() = 0;                        // ends a pass before the last
  virtual float amax() const = 0;                      // after the last pass (0 if nothing was seen)
};

// max: the largest |x| seen. One pass.
std::unique_ptr<RangeCollector> make_max_collector();
// percentile p of |x| (0 < p <= 100), exact: the nearest-rank order statistic,
// the ceil(p/100 * n)-th smallest |x| of all n values seen. Pass 1 counts
// values into 65536 bins keyed by the top 16 bits of |x|'s f32 pattern
// (order-preserving for non-negative floats); pass 2 counts, within the one
// bin that holds the wanted rank, the remaining 15 bits, which gives that
// value bit for bit. Fixed memory (under 1 MiB), no sorting, no sample kept.
std::unique_ptr<RangeCollector> make_percentile_collector(double p);
// entropy / MSE over `bins` bins of |x| on [0, amax of pass 1], for the code
// type `code` (f8e4m3 or i8): see calibrate.cpp for the algorithms.
std::unique_ptr<RangeCollector> make_entropy_collector(DType code, int bins = 2048);
std::unique_ptr<RangeCollector> make_mse_collector(DType code, int bins = 2048);
std::unique_ptr<RangeCollector> make_collector(const CalibSettings& s, DType code);

// The threshold choices on a histogram of |x| > 0 (counts[j] holds values in
// [j, j+1) * width); exposed for tests. Exact zeros are left out: they code
// to 0 at any scale, so they carry no information about the threshold.
float entropy_threshold(const std::vector<uint64_t>& counts, float width, DType code);
float mse_threshold(const std::vector<uint64_t>& counts, float width, DType code);

// The calibrated ranges of a graph's activations, keyed by value name.
struct ActivationScales {
  DType precision = DType::F8E4M3;
  CalibSettings settings;
  int64_t batches = 0;
  std::map<std::string, float> amax;
  // scale_for_amax(amax of `value`); Error(Usage) naming the value when absent.
  float scale(const std::string& value) const;
  bool operator==(const ActivationScales&) const = default;
};

// The activations a quantized node needs a static scale for: its
// non-constant inputs (data, residual) and its outputs. Ascending value ids.
std::vector<int> calibrated_values(const Graph& g, const std::vector<int>& nodes);

// The calibration inputs: `batches` batches, batch i one f32 buffer per graph
// input (g.inputs order), each as long as that input's shape in g says.
struct CalibrationData {
  int64_t batches = 0;
  std::function<std::vector<std::vector<float>>(int64_t i)> batch;
};

// Runs g on the CPU backend node by node (CpuProgram::run_node on dense
// buffers, each freed after its last reader) and hands every value whose
// wanted[value id] is set to observe(value id, data, count) once it is
// written (graph inputs before the first node).
using ValueObserver = std::function<void(int value, const float* data, size_t count)>;
void run_cpu_observed(const Graph& g, const std::vector<std::vector<float>>& inputs, const std::vector<char>& wanted,
                      const ValueObserver& observe);

// Calibrates the activations of `nodes` (select_quantized's list) over
// `data`, running every batch once per pass the method needs. progress(done,
// total) is called after each batch run (total = batches * passes).
ActivationScales calibrate(const Graph& g, const std::vector<int>& nodes, DType precision, const CalibSettings& settings,
                           const CalibrationData& data, const std::function<void(int64_t, int64_t)>& progress = {});

// Every value `nodes` need has a scale; Error(Usage) naming the first missing
// value and `source` (the scales file) otherwise.
void check_scales_cover(const Graph& g, const std::vector<int>& nodes, const ActivationScales& s, const std::string& source);

// The scales file: {"format": 1, "precision": "fp8", "calibration": {...},
// "batches": N, "values": {"<value name>": {"amax": a, "scale": s}}}; strict
// (scale must equal scale_for_amax(amax): a hand edit of one is caught).
std::string scales_to_json(const ActivationScales& s);
ActivationScales parse_scales(const std::string& text, const std::string& source);
ActivationScales read_scales(const std::string& path);
void write_scales(const ActivationScales& s, const std::string& path);  // atomic

}  // namespace kiln::quant
