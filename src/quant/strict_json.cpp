#include "quant/strict_json.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/file.hpp"

namespace kiln::quant {

using nlohmann::json;

namespace {
constexpr size_t kMaxJsonBytes = size_t{16} << 20;
}

json parse_json_text(const std::string& text, const std::string& source) {
  if (text.size() > kMaxJsonBytes) fail_input(source, ": ", text.size(), " bytes, more than the 16 MiB a quantization file may have");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail_input(source, ": not valid JSON (", e.what(), ")");
  }
}

std::string read_text_file(const std::string& path) {
  const Blob b = read_file_blob(path);
  if (b.size > kMaxJsonBytes) fail_input(path, ": ", b.size, " bytes, more than the 16 MiB a quantization file may have");
  return std::string(reinterpret_cast<const char*>(b.data), b.size);
}

StrictObject::StrictObject(const json& j, std::string source, std::string path, const std::set<std::string>& required,
                           const std::set<std::string>& optional)
    : j_(&j), source_(std::move(source)), path_(std::move(path)) {
  if (!j.is_object()) fail_input(source_, ": ", path_.empty() ? std::string("the file") : "key '" + path_ + "'", " must be a JSON object");
  for (const auto& [k, v] : j.items())
    if (!required.count(k) && !optional.count(k)) {
      std::string known;
      for (const auto* set : {&required, &optional})
        for (const auto& name : *set) known += (known.empty() ? "" : ", ") + name;
      fail_input(source_, ": unknown ", key_path(k), " (known: ", known, ")");
    }
  for (const auto& k : required)
    if (!j.contains(k)) fail_input(source_, ": missing ", key_path(k));
}

void StrictObject::fail(const std::string& key, const std::string& what) const {
  fail_input(source_, ": ", key_path(key), " ", what);
}

std::string StrictObject::string(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_string()) fail(key, "must be a string");
  return v.get<std::string>();
}

double StrictObject::number(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_number()) fail(key, "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(key, "must be finite");
  return d;
}

int64_t StrictObject::integer(const std::string& key) const {
  const json& v = at(key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail(key, "is out of range");
  if (!v.is_number_integer()) fail(key, "must be an integer");
  return v.get<int64_t>();
}

bool StrictObject::boolean(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_boolean()) fail(key, "must be true or false");
  return v.get<bool>();
}

std::vector<std::string> StrictObject::strings(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_array()) fail(key, "must be a list of strings");
  std::vector<std::string> out;
  for (const auto& s : v) {
    if (!s.is_string()) fail(key, "must be a list of strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}

StrictObject StrictObject::object(const std::string& key, const std::set<std::string>& required,
                                  const std::set<std::string>& optional) const {
  return StrictObject(at(key), source_, path_.empty() ? key : path_ + "." + key, required, optional);
}

}  // namespace kiln::quant
