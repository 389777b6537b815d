#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "../../include/kiln/kiln.hpp"  // DType is public API (new dtypes go at the end there)

namespace kiln {

size_t dtype_size(DType t);
// Canonical lower-case name used in graph.json and error messages ("f32", "f16", ...).
const char* dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
// safetensors spells dtypes "F32", "F16", "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_safetensors(std::string_view name);
const char* dtype_safetensors_name(DType t);
bool dtype_is_float(DType t);

}  // namespace kiln
