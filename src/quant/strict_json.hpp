// Strict reading of the quantization files (recipes, activation scales):
// every key known, required keys present, each of the right type, and every
// error an Error(Input) that names the file and the key path ("r.json: key
// 'defaults.stem' must be true or false").
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace kiln::quant {

// Parses `text` (at most 16 MiB) as JSON; errors name `source`.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);
// The bytes of a file (at most 16 MiB); errors name the path.
std::string read_text_file(const std::string& path);

// A JSON object checked against its keys when made; the getters check types.
class StrictObject {
 public:
  StrictObject(const nlohmann::json& j, std::string source, std::string path, const std::set<std::string>& required,
               const std::set<std::string>& optional);
  bool has(const std::string& key) const { return j_->contains(key); }
  std::string string(const std::string& key) const;
  double number(const std::string& key) const;  // finite
  int64_t integer(const std::string& key) const;
  bool boolean(const std::string& key) const;
  std::vector<std::string> strings(const std::string& key) const;
  StrictObject object(const std::string& key, const std::set<std::string>& required, const std::set<std::string>& optional) const;
  const nlohmann::json& at(const std::string& key) const { return j_->at(key); }
  // "key 'a.b'" for messages about one key.
  std::string key_path(const std::string& key) const { return "key '" + (path_.empty() ? key : path_ + "." + key) + "'"; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json* j_;
  std::string source_, path_;
};

}  // namespace kiln::quant
