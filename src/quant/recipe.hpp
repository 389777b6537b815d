// Quantization recipes (issue #13): the precision, how weight and activation
// scales are made, and which layers are quantized, chosen by named parts and
// node-name globs, minus the default exclusions that are known not to pay.
// File format and part names: docs/quantization.md.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "ir/graph.hpp"

namespace kiln::quant {

// How activation ranges are measured (quant/calibrate.hpp).
enum class CalibMethod { Max, Percentile, Entropy, Mse };
const char* calib_method_name(CalibMethod m);  // "max", "percentile", "entropy", "mse"
CalibMethod calib_method_from_name(const std::string& name, const std::string& where);

struct CalibSettings {
  CalibMethod method = CalibMethod::Max;
  double percentile = 99.99;  // of |x|, for CalibMethod::Percentile; in (0, 100]
  bool operator==(const CalibSettings&) const = default;
};
// The "calibration" object of recipe and scales files: {"method": "percentile",
// "percentile": 99.99} ("percentile" only with that method). The reader is
// strict; errors name `source` and `key`.
nlohmann::json calib_settings_to_json(const CalibSettings& s);
CalibSettings calib_settings_from_json(const nlohmann::json& j, const std::string& source, const std::string& key);

// The stock exclusions (FIELD-NOTES §4: what TensorRT / ModelOpt keep in 16
// bits because 8 bits does not pay there). Each applies unless switched off.
struct DefaultExclusions {
  bool stem = true;        // the stem convs (a 3-channel input, 7x7 filters)
  bool classifier = true;  // the final linear (a GEMV at batch 1)
  bool depthwise = true;   // groups == input channels > 1: no fast 8-bit kernels
  int64_t max_small_channels = 16;  // in or out channels <= this stay 16-bit; 0 turns the rule off
  // squeeze-excitation's convs (the reduce reading a global pool, the expand
  // reading the reduce): a GEMV per image whose 8-bit form costs a quantize, a
  // pad and an epilogue kernel and splits the fused SE step, to save a few KiB.
  bool pooled = true;
  bool operator==(const DefaultExclusions&) const = default;
};

struct Recipe {
  DType precision = DType::F8E4M3;  // F8E4M3 ("fp8") or I8 ("int8")
  // The only rules so far, named in the file so later ones can be added:
  // weights per output channel, scale = amax / code_max; activations static
  // per tensor, scale = calibrated amax / code_max.
  std::string weight_scales = "per_channel_amax";
  std::string activation_scales = "static_per_tensor";
  CalibSettings calibration;
  std::vector<std::string> parts = {"all"};  // applied in order: "all", "<part>", "no-<part>"
  std::vector<std::string> include;         // node-name / op globs added after the parts
  std::vector<std::string> exclude;         // node-name / op globs removed after include
  DefaultExclusions defaults;
  // "residuals": "8bit" (default) lets a quantized layer whose output is read
  // only by quantized layers — as their input or as the residual their
  // epilogue adds — write codes, the residual read in 8 bits (TensorRT's
  // "quantize the skip input"); "wide" keeps residual inputs 16/32-bit.
  bool residuals_8bit = true;
  bool operator==(const Recipe&) const = default;
};

// "fp8" -> F8E4M3, "int8" -> I8 (Error(Usage) naming `where` otherwise), and back.
DType precision_from_name(const std::string& name, const std::string& where);
const char* precision_name(DType precision);

// The recipe file (JSON, strict: unknown keys, wrong types, bad values are
// Error(Input) naming the file and key). `source` names the text in errors.
Recipe parse_recipe(const std::string& text, const std::string& source);
Recipe read_recipe(const std::string& path);
// The file form of a recipe (every key written); parse_recipe reads it back equal.
std::string recipe_to_json(const Recipe& r);

// Family-specific named parts (RT-DETR's linear groups, for instance): part
// name -> node-name globs. The built-in parts are listed in docs/quantization.md.
using PartTable = std::map<std::string, std::vector<std::string>>;

struct Exclusion {
  int node = -1;
  std::string reason;
};
// Every candidate (a conv2d or linear with a constant weight) is either
// quantized or excluded with its reasons; other nodes are not candidates.
struct Selection {
  std::vector<int> quantized;      // node indices, ascending
  std::vector<Exclusion> excluded;  // ascending by node
};
bool is_quantization_candidate(const Graph& g, const Node& n);
// Throws Error(Usage) naming a part or glob that selects nothing in g (a typo
// must not silently quantize nothing).
Selection select_quantized(const Graph& g, const Recipe& r, const PartTable& extra_parts = {});

}  // namespace kiln::quant
