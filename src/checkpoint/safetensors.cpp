#include "checkpoint/safetensors.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/error.hpp"
#include "core/file.hpp"

namespace kiln {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Parses JSON without exceptions and reports the first duplicated top-level
// key: nlohmann silently keeps the last one, and two readers disagreeing on
// which duplicate wins is a classic way to smuggle different weights.
json parse_json_strict(const uint8_t* begin, const uint8_t* end, const std::string& label,
                       const char* what) {
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && duplicate.empty() && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) duplicate = k;
    }
    return true;
  };
  json j = json::parse(begin, end, on_event, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail_input(label, ": ", what, " is not valid JSON (or not valid UTF-8)");
  if (!j.is_object()) fail_input(label, ": ", what, " must be a JSON object, got ", j.type_name());
  if (!duplicate.empty()) fail_input(label, ": ", what, " has key '", duplicate, "' more than once");
  return j;
}

// Reads a non-negative JSON integer that fits in int64 (so later signed
// arithmetic on shapes and offsets cannot overflow).
bool as_nonneg_i64(const json& v, int64_t& out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    out = v.get<int64_t>();
    return out >= 0;
  }
  return false;
}

struct Span {
  uint64_t begin, end;
  const std::string* name;
};

HostTensor parse_entry(const std::string& label, const std::string& name, const json& e,
                       const Blob& bytes, uint64_t data_start, uint64_t data_size,
                       std::vector<Span>& spans) {
  auto bad = [&](auto&&... parts) { fail_input(label, ": tensor '", name, "': ", parts...); };
  if (name.empty()) fail_input(label, ": tensor with an empty name");
  if (!e.is_object()) bad("entry must be an object, got ", e.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) bad("missing key '", key, "'");

  const json& jd = e["dtype"];
  if (!jd.is_string()) bad("'dtype' must be a string, got ", jd.type_name());
  auto dtype = dtype_from_safetensors(jd.get_ref<const std::string&>());
  if (!dtype) bad("unknown dtype '", jd.get_ref<const std::string&>(), "'");

  const json& js = e["shape"];
  if (!js.is_array()) bad("'shape' must be an array, got ", js.type_name());
  Shape shape;
  // numel of the non-zero dims; bounding it keeps shape_numel() (which
  // multiplies left to right in int64) free of overflow for any dim order.
  uint64_t numel_nz = 1;
  bool has_zero = false;
  for (const json& d : js) {
    int64_t v = 0;
    if (!d.is_number_integer()) bad("'shape' must hold integers, got ", d.dump());
    if (!as_nonneg_i64(d, v)) bad("'shape' has negative or oversized dimension ", d.dump());
    shape.push_back(v);
    if (v == 0) {
      has_zero = true;
    } else if (__builtin_mul_overflow(numel_nz, static_cast<uint64_t>(v), &numel_nz) ||
               numel_nz > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      bad("shape ", shape_str(shape), "... has too many elements");
    }
  }
  const uint64_t numel = has_zero ? 0 : numel_nz;

  const json& jo = e["data_offsets"];
  int64_t b = 0, en = 0;
  if (!jo.is_array() || jo.size() != 2 || !as_nonneg_i64(jo[0], b) || !as_nonneg_i64(jo[1], en))
    bad("'data_offsets' must be two non-negative integers, got ", jo.dump());
  const uint64_t begin = static_cast<uint64_t>(b), end = static_cast<uint64_t>(en);
  if (begin > end) bad("data_offsets [", begin, ",", end, "] has begin > end");
  if (end > data_size) bad("data_offsets end ", end, " is beyond the data region (", data_size, " bytes)");

  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(*dtype)), &nbytes) ||
      nbytes != end - begin)
    bad("shape ", shape_str(shape), " of ", dtype_name(*dtype), " needs ", numel, " x ",
        dtype_size(*dtype), " bytes but data_offsets span ", end - begin);

  HostTensor t;
  t.dtype = *dtype;
  t.shape = std::move(shape);
  const uint8_t* p = bytes.data + data_start + begin;
  // Writers pad the header so data is aligned; for a file that does not,
  // copy rather than hand out a pointer that is UB to read as float/int.
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(*dtype) != 0) {
    t.blob = Blob::copy_of(p, nbytes);
  } else {
    t.blob.owner = bytes.owner;
    t.blob.data = p;
    t.blob.size = nbytes;
  }
  if (nbytes > 0) spans.push_back({begin, end, &name});
  return t;
}

}  // namespace

SafetensorsFile parse_safetensors(const Blob& bytes, const std::string& label) {
  if (bytes.size < 8)
    fail_input(label, ": file is ", bytes.size, " bytes, too short for a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes.data[i];  // little-endian u64
  if (n > kSafetensorsMaxHeader)
    fail_input(label, ": header length ", n, " exceeds the ", kSafetensorsMaxHeader, "-byte cap");
  if (n > bytes.size - 8)
    fail_input(label, ": header length ", n, " runs past the end of the file (", bytes.size, " bytes)");
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = bytes.size - data_start;

  json header = parse_json_strict(bytes.data + 8, bytes.data + data_start, label, "header");

  SafetensorsFile f;
  f.mapping = bytes;
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail_input(label, ": '__metadata__' must be an object, got ", e.type_name());
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          fail_input(label, ": '__metadata__' value for '", m.key(), "' must be a string");
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    f.tensors[name] = parse_entry(label, name, e, bytes, data_start, data_size, spans);
  }

  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      fail_input(label, ": tensor '", *spans[i].name, "' [", spans[i].begin, ",", spans[i].end,
                 ") overlaps tensor '", *spans[i - 1].name, "' [", spans[i - 1].begin, ",",
                 spans[i - 1].end, ")");
  return f;
}

SafetensorsFile read_safetensors(const fs::path& path) {
  SafetensorsFile f = parse_safetensors(map_file(path), path.string());
  f.path = path;
  return f;
}

// ---------------------------------------------------------------------------

void Checkpoint::add_file(SafetensorsFile&& f) {
  const size_t index = files_.size();
  const std::string fname = f.path.filename().string();
  for (auto& [name, t] : f.tensors) {
    auto found = tensors_.find(name);
    if (found != tensors_.end())
      fail_input(source_.string(), ": tensor '", name, "' appears in both ",
                 files_[found->second.file_index].filename().string(), " and ", fname);
    tensors_.emplace(name, Entry{std::move(t), index});
  }
  metadata_[fname] = std::move(f.metadata);
  files_.push_back(f.path);
  mappings_.push_back(std::move(f.mapping));
}

namespace {

// Shard names come from an untrusted index; they must name files beside it.
void check_shard_name(const std::string& label, const std::string& tensor, const std::string& file) {
  bool bad = file.empty() || file == "." || file.find("..") != std::string::npos ||
             file.find('/') != std::string::npos || file.find('\\') != std::string::npos ||
             file.find('\0') != std::string::npos;
  if (bad)
    fail_input(label, ": tensor '", tensor, "' maps to file name '", file,
               "', which is not a plain file name in the index's directory");
}

Checkpoint open_dir(const fs::path& dir);

}  // namespace

std::map<std::string, std::string> parse_safetensors_index(const uint8_t* data, size_t size, const std::string& label) {
  json index = parse_json_strict(data, data + size, label, "index");
  if (!index.contains("weight_map")) fail_input(label, ": missing key 'weight_map'");
  const json& wm = index["weight_map"];
  if (!wm.is_object()) fail_input(label, ": 'weight_map' must be an object, got ", wm.type_name());
  if (wm.empty()) fail_input(label, ": 'weight_map' lists no tensors");

  std::map<std::string, std::string> want;  // tensor -> file name
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    if (!it.value().is_string())
      fail_input(label, ": 'weight_map' entry for tensor '", it.key(), "' must be a string");
    const std::string& file = it.value().get_ref<const std::string&>();
    check_shard_name(label, it.key(), file);
    want[it.key()] = file;
  }
  return want;
}

Checkpoint Checkpoint::open(const fs::path& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail_input(path.string(), ": checkpoint not found");
  if (fs::is_directory(st)) return open_dir(path);

  Checkpoint c;
  c.source_ = path;
  if (path.extension() != ".json") {
    c.add_file(read_safetensors(path));
    return c;
  }

  const std::string label = path.string();
  const std::vector<uint8_t> text = read_file_bytes(path);
  const std::map<std::string, std::string> want = parse_safetensors_index(text.data(), text.size(), label);
  std::set<std::string> shards;
  for (const auto& [tensor, file] : want) shards.insert(file);
  const fs::path dir = path.parent_path();
  for (const std::string& file : shards) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / file, ec))
      fail_input(label, ": shard '", file, "' listed in 'weight_map' does not exist in ", dir.string());
    c.add_file(read_safetensors(dir / file));
  }
  for (const auto& [tensor, file] : want) {
    auto found = c.tensors_.find(tensor);
    if (found == c.tensors_.end())
      fail_input(label, ": tensor '", tensor, "' is listed in ", file, " but that file does not contain it");
    const std::string actual = c.files_[found->second.file_index].filename().string();
    if (actual != file)
      fail_input(label, ": tensor '", tensor, "' is listed in ", file, " but is in ", actual);
  }
  return c;
}

namespace {

Checkpoint open_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / kSingleName, ec)) return Checkpoint::open(dir / kSingleName);
  if (fs::is_regular_file(dir / kIndexName, ec)) return Checkpoint::open(dir / kIndexName);
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" && fs::is_regular_file(e.path(), ec))
      found.push_back(e.path());
  if (ec) fail_input(dir.string(), ": cannot list directory: ", ec.message());
  if (found.empty())
    fail_input(dir.string(), ": no ", kSingleName, ", ", kIndexName, " or other .safetensors file");
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    std::string names;
    for (const auto& p : found) names += (names.empty() ? "" : ", ") + p.filename().string();
    fail_input(dir.string(), ": several .safetensors files and no ", kIndexName, " to say which: ", names);
  }
  return Checkpoint::open(found[0]);
}

}  // namespace

bool Checkpoint::has(const std::string& name) const { return tensors_.count(name) != 0; }

const HostTensor& Checkpoint::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail_input("tensor '", name, "' not found in ", source_.string());
  return it->second.tensor;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);  // std::map: already sorted
  return out;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail_input("tensor '", name, "' not found in ", source_.string());
  return files_[it->second.file_index].filename().string();
}

std::map<std::string, std::string> Checkpoint::file_sha256() const {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < files_.size(); ++i)
    out[files_[i].filename().string()] = sha256_hex(mappings_[i].data, mappings_[i].size);
  return out;
}

}  // namespace kiln
