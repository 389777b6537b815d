// kiln's on/off switches in the environment (KILN_FUSE_SE=0, KILN_CUDA_VIEWS=1,
// ...; docs/cuda-backend.md lists them): "0" is off, "1" is on, anything
// else (or unset) leaves the default.
#pragma once
#include <cstdlib>
#include <optional>
#include <string_view>

namespace kiln {

inline std::optional<bool> env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  const std::string_view s(v);
  if (s == "0") return false;
  if (s == "1") return true;
  return std::nullopt;
}

}  // namespace kiln
