// The CUDA tactics section of a bundle (`tactics.<gpu>.json`, written by
// CudaEngine::tactics_json): which GPU and libraries it was built on, the
// tactic of every layer per built batch, and per batch the recorded plan
// (docs/plan-format.md). Read by the CUDA backend at load and by
// `kiln inspect --plan` without a GPU, so it is checked once, here, without
// one: every known key has its type, or Error(Input) names the section and
// the key; unknown keys are ignored (a later kiln may add some).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace kiln {

// `source` names the section for messages, e.g. "m.bundle: tactics.h200.json".
// Returns the parsed record.
nlohmann::json parse_tactics_record(const std::string& text, const std::string& source);

}  // namespace kiln
