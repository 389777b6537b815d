#include "core/switches.hpp"

#include "core/error.hpp"

namespace kiln {

namespace {
constexpr std::array<const char*, kSwitchCount> kNames = {"fuse_se",    "fuse_se_mul", "window_conv", "cuda_views",
                                                          "fuse_split", "pdl",         "fuse_add",    "fp8_one_kernel",
                                                          "fuse_mlp",   "igemm_conv", "side_lane",
                                                          "conv_knobs", "gemm_conv",  "small_gemm",
                                                          "linear_norm", "concat_mask", "sm90_conv",
                                                          "direct_conv", "cluster_top_k", "wide_attention",
                                                          "warp_deform", "memset_kernels", "late_side_fork",
                                                          "weight_prefetch", "prefetch_evict_last", "chain_side_fork"};

std::optional<Switch> find_switch(std::string_view name) {
  for (int i = 0; i < kSwitchCount; ++i)
    if (name == kNames[i]) return static_cast<Switch>(i);
  return std::nullopt;
}
}  // namespace

const char* switch_name(Switch s) {
  const int i = static_cast<int>(s);
  if (i < 0 || i >= kSwitchCount) fail_runtime("switch_name: no switch number ", i);
  return kNames[i];
}

std::string switch_names() {
  std::string r;
  for (const char* n : kNames) r += (r.empty() ? "" : ", ") + std::string(n);
  return r;
}

void EngineSwitches::set_list(const std::string& names, bool on) {
  size_t start = 0;
  while (start <= names.size()) {
    size_t end = names.find(',', start);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(start, end - start);
    if (!name.empty()) {
      auto s = find_switch(name);
      if (!s) fail_usage("unknown engine switch '", name, "' (known: ", switch_names(), ")");
      set(*s, on);
    }
    start = end + 1;
  }
}

bool EngineSwitches::all_auto() const {
  for (const auto& v : v_)
    if (v) return false;
  return true;
}

nlohmann::json EngineSwitches::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kSwitchCount; ++i) j[kNames[i]] = !v_[i] ? "auto" : (*v_[i] ? "on" : "off");
  return j;
}

EngineSwitches EngineSwitches::from_json(const nlohmann::json& j, const std::string& where) {
  EngineSwitches s;
  if (j.is_null()) return s;
  if (!j.is_object()) fail_input(where, ": 'switches' must be an object, got ", j.dump());
  for (const auto& [key, value] : j.items()) {
    auto sw = find_switch(key);
    if (!sw) fail_input(where, ": unknown engine switch '", key, "' (this kiln knows: ", switch_names(), ")");
    const std::string v = value.is_string() ? value.get<std::string>() : "";
    if (v == "on") s.set(*sw, true);
    else if (v == "off") s.set(*sw, false);
    else if (v != "auto") fail_input(where, ": engine switch '", key, "' must be \"auto\", \"on\" or \"off\", got ", value.dump());
  }
  return s;
}

}  // namespace kiln
