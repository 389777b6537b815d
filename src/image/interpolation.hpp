// Resampling filters shared by the image pre-processing and the checkpoint
// config reader (timm's pretrained_cfg "interpolation" key). Kept in its own
// tiny header so both modules can include it without pulling in each other.
#pragma once
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace kiln {

// Only the filters timm's classifiers actually use; PIL's box/hamming/lanczos
// are rejected by interpolation_from_name rather than silently approximated.
enum class Interpolation { Nearest, Bilinear, Bicubic };

inline const char* interpolation_name(Interpolation interp) {
  switch (interp) {
    case Interpolation::Nearest: return "nearest";
    case Interpolation::Bilinear: return "bilinear";
    case Interpolation::Bicubic: return "bicubic";
  }
  return "unknown";
}

// Accepts timm's spellings ("bicubic", ...). Throws Error(Input) for anything
// else so a checkpoint asking for e.g. "lanczos" fails loudly.
inline Interpolation interpolation_from_name(std::string_view name) {
  if (name == "nearest") return Interpolation::Nearest;
  if (name == "bilinear") return Interpolation::Bilinear;
  if (name == "bicubic") return Interpolation::Bicubic;
  fail_input("unsupported interpolation '", std::string(name),
             "' (kiln supports nearest, bilinear, bicubic)");
}

// The same, with `where` (file and key) leading the error message.
inline Interpolation interpolation_from_name(std::string_view name, const std::string& where) {
  try {
    return interpolation_from_name(name);
  } catch (const Error& e) {
    fail_input(where, ": ", e.what());
  }
}

}  // namespace kiln
