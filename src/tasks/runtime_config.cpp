#include "tasks/runtime_config.hpp"

#include <set>

#include "core/error.hpp"

namespace kiln {

using nlohmann::json;

namespace {

void expect_keys(const json& j, const std::set<std::string>& keys, const std::string& where) {
  if (!j.is_object()) fail_input(where, ": expected an object");
  for (const auto& [k, v] : j.items())
    if (!keys.count(k)) fail_input(where, ": unknown key '", k, "'");
  for (const auto& k : keys)
    if (!j.contains(k)) fail_input(where, ": missing key '", k, "'");
}

const json& typed(const json& j, const char* key, json::value_t t, const std::string& where) {
  const json& v = j.at(key);
  bool ok = v.type() == t || (t == json::value_t::number_float && v.is_number()) ||
            (t == json::value_t::number_integer && v.is_number_unsigned());
  if (!ok) fail_input(where, ": key '", key, "' has the wrong type");
  return v;
}

std::array<float, 3> triple(const json& j, const char* key, const std::string& where) {
  const json& v = typed(j, key, json::value_t::array, where);
  if (v.size() != 3) fail_input(where, ": key '", key, "' must hold 3 numbers");
  std::array<float, 3> r{};
  for (size_t i = 0; i < 3; ++i) {
    if (!v[i].is_number()) fail_input(where, ": key '", key, "' must hold 3 numbers");
    r[i] = v[i].get<float>();
  }
  return r;
}

}  // namespace

TimmPreprocess timm_preprocess_of(const TimmEvalPreprocess& p) {
  TimmPreprocess pre;
  pre.height = p.height;
  pre.width = p.width;
  pre.crop_pct = p.crop_pct;
  pre.interpolation = p.interpolation;
  pre.mean = p.mean;
  pre.std = p.std;
  pre.crop_mode = p.crop_mode;
  return pre;
}

ResizeRescale resize_rescale_of(const DetectionPreprocess& p) {
  ResizeRescale pre;
  pre.height = p.height;
  pre.width = p.width;
  pre.interpolation = p.interpolation;
  pre.rescale = p.rescale;
  return pre;
}

json to_json(const ClassificationRuntime& r) {
  const auto& p = r.preprocess;
  return {{"task", "classification"},
          {"input", r.input},
          {"output", r.output},
          {"num_classes", r.num_classes},
          {"preprocess",
           {{"kind", "timm_eval"},
            {"height", p.height},
            {"width", p.width},
            {"crop_pct", p.crop_pct},
            {"crop_mode", p.crop_mode},
            {"interpolation", interpolation_name(p.interpolation)},
            {"mean", p.mean},
            {"std", p.std}}}};
}

ClassificationRuntime parse_classification_runtime(const json& j, const std::string& source) {
  expect_keys(j, {"task", "input", "output", "num_classes", "preprocess"}, source);
  ClassificationRuntime r;
  if (typed(j, "task", json::value_t::string, source).get<std::string>() != "classification")
    fail_input(source, ": key 'task' must be \"classification\"");
  r.input = typed(j, "input", json::value_t::string, source).get<std::string>();
  r.output = typed(j, "output", json::value_t::string, source).get<std::string>();
  r.num_classes = typed(j, "num_classes", json::value_t::number_integer, source).get<int>();
  if (r.num_classes <= 0) fail_input(source, ": key 'num_classes' must be positive");
  const std::string where = source + ": preprocess";
  const json& p = j.at("preprocess");
  expect_keys(p, {"kind", "height", "width", "crop_pct", "crop_mode", "interpolation", "mean", "std"}, where);
  if (typed(p, "kind", json::value_t::string, where).get<std::string>() != "timm_eval")
    fail_input(where, ": key 'kind' must be \"timm_eval\"");
  auto& pp = r.preprocess;
  pp.height = typed(p, "height", json::value_t::number_integer, where).get<int>();
  pp.width = typed(p, "width", json::value_t::number_integer, where).get<int>();
  if (pp.height <= 0 || pp.width <= 0 || pp.height > 8192 || pp.width > 8192)
    fail_input(where, ": height/width out of range");
  pp.crop_pct = typed(p, "crop_pct", json::value_t::number_float, where).get<float>();
  if (!(pp.crop_pct > 0.f && pp.crop_pct <= 4.f)) fail_input(where, ": key 'crop_pct' out of range");
  pp.crop_mode = typed(p, "crop_mode", json::value_t::string, where).get<std::string>();
  // timm's three eval crop modes, all reproduced by src/image/preprocess.cpp.
  if (pp.crop_mode != "center" && pp.crop_mode != "squash" && pp.crop_mode != "border")
    fail_input(where, ": crop_mode '", pp.crop_mode, "' is not supported (center, squash, border)");
  pp.interpolation =
      interpolation_from_name(typed(p, "interpolation", json::value_t::string, where).get<std::string>(), where);
  pp.mean = triple(p, "mean", where);
  pp.std = triple(p, "std", where);
  for (float s : pp.std)
    if (!(s > 0.f)) fail_input(where, ": key 'std' must be positive");
  return r;
}

json to_json(const DetectionRuntime& r) {
  const auto& p = r.preprocess;
  return {{"task", "detection"},
          {"input", r.input},
          {"logits", r.logits},
          {"boxes", r.boxes},
          {"num_classes", r.num_classes},
          {"num_queries", r.num_queries},
          {"preprocess",
           {{"kind", "resize_rescale"},
            {"height", p.height},
            {"width", p.width},
            {"interpolation", interpolation_name(p.interpolation)},
            {"rescale", p.rescale}}}};
}

DetectionRuntime parse_detection_runtime(const json& j, const std::string& source) {
  expect_keys(j, {"task", "input", "logits", "boxes", "num_classes", "num_queries", "preprocess"}, source);
  DetectionRuntime r;
  if (typed(j, "task", json::value_t::string, source).get<std::string>() != "detection")
    fail_input(source, ": key 'task' must be \"detection\"");
  r.input = typed(j, "input", json::value_t::string, source).get<std::string>();
  r.logits = typed(j, "logits", json::value_t::string, source).get<std::string>();
  r.boxes = typed(j, "boxes", json::value_t::string, source).get<std::string>();
  r.num_classes = typed(j, "num_classes", json::value_t::number_integer, source).get<int>();
  r.num_queries = typed(j, "num_queries", json::value_t::number_integer, source).get<int>();
  if (r.num_classes <= 0 || r.num_classes > 100000) fail_input(source, ": key 'num_classes' out of range");
  if (r.num_queries <= 0 || r.num_queries > 100000) fail_input(source, ": key 'num_queries' out of range");
  const std::string where = source + ": preprocess";
  const json& p = j.at("preprocess");
  expect_keys(p, {"kind", "height", "width", "interpolation", "rescale"}, where);
  if (typed(p, "kind", json::value_t::string, where).get<std::string>() != "resize_rescale")
    fail_input(where, ": key 'kind' must be \"resize_rescale\"");
  auto& pp = r.preprocess;
  pp.height = typed(p, "height", json::value_t::number_integer, where).get<int>();
  pp.width = typed(p, "width", json::value_t::number_integer, where).get<int>();
  if (pp.height <= 0 || pp.width <= 0 || pp.height > 8192 || pp.width > 8192)
    fail_input(where, ": height/width out of range");
  pp.interpolation =
      interpolation_from_name(typed(p, "interpolation", json::value_t::string, where).get<std::string>(), where);
  pp.rescale = typed(p, "rescale", json::value_t::number_float, where).get<float>();
  if (!(pp.rescale > 0.f && pp.rescale <= 1.f)) fail_input(where, ": key 'rescale' out of range (0, 1]");
  return r;
}

void validate_runtime_json(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail_input(source, ": not a JSON object");
  if (!j.contains("task") || !j["task"].is_string()) fail_input(source, ": missing key 'task'");
  if (j["task"] == "classification") {
    parse_classification_runtime(j, source);
    return;
  }
  if (j["task"] == "detection") {
    parse_detection_runtime(j, source);
    return;
  }
  fail_input(source, ": task ", j["task"].dump(), " is not supported by this kiln");
}

}  // namespace kiln
