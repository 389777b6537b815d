// kiln bench --profile and kiln study: per-layer times of one engine call,
// summed per layer group (consecutive layers of one group key).
#pragma once
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine_impl.hpp"

namespace kiln::cli {

// Group key of a node name: its first component ("layer2.1.conv2" -> "layer2"),
// plus the stage index when the first component is a bare container name
// ("blocks.3.1.conv_dw" -> "blocks.3"), or the named part under it when the
// name goes deeper ("model.decoder.layers.0.fc1" -> "model.decoder").
inline std::string group_of(const std::string& name) {
  auto dot = name.find('.');
  std::string head = name.substr(0, dot);
  bool has_digit = std::any_of(head.begin(), head.end(), ::isdigit);
  if (dot == std::string::npos || has_digit) return head;
  auto dot2 = name.find('.', dot + 1);
  std::string second = name.substr(dot + 1, dot2 == std::string::npos ? std::string::npos : dot2 - dot - 1);
  bool numeric = !second.empty() && std::all_of(second.begin(), second.end(), ::isdigit);
  // A bare container over named parts, three levels deep or more (Hugging
  // Face detectors: "model.backbone.model...", "model.encoder.fpn_blocks...",
  // "model.decoder.layers.0..."): the part is the group.
  if (!numeric && dot2 != std::string::npos) return head + "." + second;
  return numeric ? head + "." + second : head;
}

inline nlohmann::json profile_json(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int rounds) {
  auto layers = profile_layers(ctx, inputs, rounds);
  nlohmann::json lj = nlohmann::json::array();
  std::vector<std::pair<std::string, double>> groups;
  std::map<size_t, int> counts;  // steps per group
  double total = 0;
  for (const auto& l : layers) {
    lj.push_back({{"name", l.name}, {"ms", l.ms}});
    std::string g = group_of(l.name);
    if (groups.empty() || groups.back().first != g) groups.push_back({g, 0.0});
    groups.back().second += l.ms;
    ++counts[groups.size() - 1];
    total += l.ms;
  }
  nlohmann::json gj = nlohmann::json::array();
  for (size_t i = 0; i < groups.size(); ++i)
    gj.push_back({{"group", groups[i].first}, {"ms", groups[i].second}, {"steps", counts[i]}});
  return {{"rounds", rounds}, {"total_ms", total}, {"groups", gj}, {"layers", lj}};
}

}  // namespace kiln::cli
