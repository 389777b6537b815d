// kiln bench --json: the load and first-call breakdowns (docs/benchmarking.md).
#pragma once
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::cli {

// {phase: ms or count} in the phases' order; create_context_ms added when >= 0.
// A phase named twice is an error of the backend that reports it: it fails loudly.
inline nlohmann::json breakdown_json(const std::vector<std::pair<std::string, double>>& phases, double create_context_ms) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, v] : phases) {
    if (out.contains(name)) throw std::logic_error("breakdown phase '" + name + "' reported twice");
    out[name] = v;
  }
  if (create_context_ms >= 0) out["create_context_ms"] = create_context_ms;
  return out;
}

}  // namespace kiln::cli
