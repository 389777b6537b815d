#include "checkpoint/hf_config.hpp"

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/file.hpp"

namespace kiln {

using nlohmann::json;

namespace {

const json* find_key(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

struct Reader {
  const std::string& label;

  const json& need(const json& obj, const char* key, const std::string& path) const {
    const json* v = find_key(obj, key);
    if (!v) fail_input(label, ": missing key '", path, "'");
    return *v;
  }
  [[noreturn]] void wrong(const std::string& path, const char* want, const json& v) const {
    fail_input(label, ": key '", path, "' must be ", want, ", got ", v.type_name(), " ", v.dump());
  }
  std::string str(const json& v, const std::string& path) const {
    if (!v.is_string()) wrong(path, "a string", v);
    return v.get<std::string>();
  }
  // Integers only (1000.0 is rejected: a float here means a malformed file).
  int integer(const json& v, const std::string& path, int min_value) const {
    if (!v.is_number_integer()) wrong(path, "an integer", v);
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    const bool too_big = v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMax)
                                                : v.get<int64_t>() > kMax;
    if (too_big) fail_input(label, ": key '", path, "' is out of range (", v.dump(), ")");
    const int r = static_cast<int>(v.get<int64_t>());
    if (r < min_value) fail_input(label, ": key '", path, "' must be >= ", min_value, ", got ", r);
    return r;
  }
  float number(const json& v, const std::string& path) const {
    if (!v.is_number()) wrong(path, "a number", v);
    double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
      fail_input(label, ": key '", path, "' is not a finite float (", v.dump(), ")");
    return static_cast<float>(d);
  }
  std::array<float, 3> triple(const json& v, const std::string& path) const {
    if (!v.is_array() || v.size() != 3) wrong(path, "an array of 3 numbers", v);
    return {number(v[0], path + "[0]"), number(v[1], path + "[1]"), number(v[2], path + "[2]")};
  }
};

}  // namespace

TimmConfig parse_timm_config(const json& j, const std::string& label) {
  const Reader r{label};
  if (!j.is_object()) fail_input(label, ": must be a JSON object, got ", j.type_name());
  TimmConfig c;
  c.architecture = r.str(r.need(j, "architecture", "architecture"), "architecture");
  if (c.architecture.empty()) fail_input(label, ": key 'architecture' is empty");
  c.num_classes = r.integer(r.need(j, "num_classes", "num_classes"), "num_classes", 0);
  if (const json* v = find_key(j, "num_features")) c.num_features = r.integer(*v, "num_features", 0);

  const json& pc = r.need(j, "pretrained_cfg", "pretrained_cfg");
  if (!pc.is_object()) r.wrong("pretrained_cfg", "an object", pc);

  const json& size = r.need(pc, "input_size", "pretrained_cfg.input_size");
  if (!size.is_array() || size.size() != 3) r.wrong("pretrained_cfg.input_size", "an array [C,H,W]", size);
  c.in_chans = r.integer(size[0], "pretrained_cfg.input_size[0]", 1);
  c.input_h = r.integer(size[1], "pretrained_cfg.input_size[1]", 1);
  c.input_w = r.integer(size[2], "pretrained_cfg.input_size[2]", 1);

  c.mean = r.triple(r.need(pc, "mean", "pretrained_cfg.mean"), "pretrained_cfg.mean");
  c.std = r.triple(r.need(pc, "std", "pretrained_cfg.std"), "pretrained_cfg.std");
  // Pre-processing divides by std.
  for (float s : c.std)
    if (!(s > 0)) fail_input(label, ": key 'pretrained_cfg.std' must be positive, got ", s);

  c.crop_pct = r.number(r.need(pc, "crop_pct", "pretrained_cfg.crop_pct"), "pretrained_cfg.crop_pct");
  // The resize target is floor(size / crop_pct); zero or negative is meaningless.
  if (!(c.crop_pct > 0)) fail_input(label, ": key 'pretrained_cfg.crop_pct' must be positive, got ", c.crop_pct);

  const std::string interp =
      r.str(r.need(pc, "interpolation", "pretrained_cfg.interpolation"), "pretrained_cfg.interpolation");
  c.interpolation = interpolation_from_name(interp, label + ": key 'pretrained_cfg.interpolation'");

  if (const json* v = find_key(pc, "crop_mode")) {
    c.crop_mode = r.str(*v, "pretrained_cfg.crop_mode");
    if (c.crop_mode != "center" && c.crop_mode != "squash" && c.crop_mode != "border")
      fail_input(label, ": key 'pretrained_cfg.crop_mode' is '", c.crop_mode,
                 "' (expected center, squash or border)");
  }

  if (const json* v = find_key(j, "label_names")) {
    if (!v->is_array()) r.wrong("label_names", "an array of strings", *v);
    for (size_t i = 0; i < v->size(); ++i) c.label_names.push_back(r.str((*v)[i], cat("label_names[", i, "]")));
    // A label list that does not match the head would mislabel every result.
    if (!c.label_names.empty() && static_cast<int>(c.label_names.size()) != c.num_classes)
      fail_input(label, ": key 'label_names' has ", c.label_names.size(), " names but num_classes is ",
                 c.num_classes);
  }
  c.raw = j;
  return c;
}

TimmConfig parse_timm_config_bytes(const uint8_t* data, size_t size, const std::string& label) {
  json j = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail_input(label, ": not valid JSON");
  return parse_timm_config(j, label);
}

TimmConfig read_timm_config(const std::filesystem::path& config_json) {
  const std::vector<uint8_t> text = read_file_bytes(config_json);
  return parse_timm_config_bytes(text.data(), text.size(), config_json.string());
}

}  // namespace kiln
