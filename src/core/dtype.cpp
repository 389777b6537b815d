#include "core/dtype.hpp"

namespace kiln {

namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  const char* name;
  const char* st_name;
  bool is_float;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F32, 4, "f32", "F32", true},        {DType::F16, 2, "f16", "F16", true},
    {DType::BF16, 2, "bf16", "BF16", true},     {DType::F8E4M3, 1, "f8e4m3", "F8_E4M3", true},
    {DType::F8E5M2, 1, "f8e5m2", "F8_E5M2", true}, {DType::I32, 4, "i32", "I32", false},
    {DType::I64, 8, "i64", "I64", false},       {DType::U8, 1, "u8", "U8", false},
    {DType::I8, 1, "i8", "I8", false},
};
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == static_cast<size_t>(DType::I8) + 1, "one row per dtype");
constexpr bool in_enum_order() {
  for (size_t i = 0; i < sizeof(kInfo) / sizeof(kInfo[0]); ++i)
    if (static_cast<size_t>(kInfo[i].type) != i) return false;
  return true;
}
static_assert(in_enum_order(), "dtype table must list dtypes in enum order");
const DTypeInfo& info(DType t) { return kInfo[static_cast<size_t>(t)]; }
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
const char* dtype_safetensors_name(DType t) { return info(t).st_name; }
bool dtype_is_float(DType t) { return info(t).is_float; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (name == i.name) return i.type;
  return std::nullopt;
}
std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& i : kInfo)
    if (name == i.st_name) return i.type;
  return std::nullopt;
}

}  // namespace kiln
