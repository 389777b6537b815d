#include "bundle/bundle.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.hpp"
#include "core/file.hpp"

namespace kiln {

using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'N', 'D', 'L'};
const std::set<std::string> kTopKeys = {"format", "kiln_version", "family", "task", "backend", "sections"};
const std::set<std::string> kSectionKeys = {"offset", "length", "sha256"};

bool is_valid_task(const std::string& s) { return s == "classification" || s == "detection"; }
bool is_valid_backend(const std::string& s) { return s == "cpu" || s == "cuda"; }

uint64_t align_up(uint64_t v) { return (v + kBundleAlignment - 1) / kBundleAlignment * kBundleAlignment; }

void put_u64_le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

bool is_lower_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Parses the header, rejecting duplicate keys: nlohmann keeps the last of
// duplicates silently, which would let two readers disagree about one file.
json parse_header_json(const std::string& where, const uint8_t* p, size_t n) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == json::parse_event_t::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(p, p + n, cb);
  } catch (const json::exception& e) {
    fail_input(where, ": header is not valid JSON: ", e.what());
  }
  if (!duplicate.empty()) fail_input(where, ": header has duplicate key '", duplicate, "'");
  if (!j.is_object()) fail_input(where, ": header is not a JSON object");
  return j;
}

// A non-negative integer that fits in u64; nlohmann stores such literals as
// unsigned, negative ones as signed and anything else (1.0, 1e3, huge) as float.
uint64_t get_u64_field(const std::string& where, const json& obj, const std::string& key,
                       const std::string& context) {
  const json& v = obj.at(key);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  fail_input(where, ": ", context, "'", key, "' must be a non-negative integer, got ", v.dump());
}

std::string get_string_field(const std::string& where, const json& obj, const std::string& key) {
  const json& v = obj.at(key);
  if (!v.is_string()) fail_input(where, ": header key '", key, "' must be a string, got ", v.dump());
  return v.get<std::string>();
}

void check_keys(const std::string& where, const json& obj, const std::set<std::string>& expected,
                const std::string& context) {
  for (const auto& [k, v] : obj.items())
    if (!expected.count(k)) fail_input(where, ": ", context, "unknown key '", k, "'");
  for (const auto& k : expected)
    if (!obj.contains(k)) fail_input(where, ": ", context, "missing key '", k, "'");
}

}  // namespace

bool is_valid_section_name(const std::string& name) {
  if (name.empty() || name.size() > kBundleMaxSectionName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

// ---------------------------------------------------------------- writer

BundleWriter::BundleWriter(BundleInfo info) : info_(std::move(info)) {
  if (info_.format != kBundleFormat)
    fail_runtime("bundle writer: this kiln writes bundle format ", kBundleFormat, " only, asked for ", info_.format);
  if (!is_valid_task(info_.task)) fail_runtime("bundle writer: invalid task '", info_.task, "'");
  if (!is_valid_backend(info_.backend)) fail_runtime("bundle writer: invalid backend '", info_.backend, "'");
}

void BundleWriter::add_section(const std::string& name, std::vector<uint8_t> bytes) {
  if (!is_valid_section_name(name)) fail_runtime("bundle writer: invalid section name '", name, "'");
  for (const auto& s : sections_)
    if (s.name == name) fail_runtime("bundle writer: duplicate section '", name, "'");
  sections_.push_back({name, std::move(bytes)});
}

void BundleWriter::add_section(const std::string& name, const std::string& text) {
  add_section(name, std::vector<uint8_t>(text.begin(), text.end()));
}

BundleWriter::Layout BundleWriter::layout(const std::string& where) const {
  std::vector<std::string> digests;
  for (const auto& s : sections_) digests.push_back(sha256_hex(s.bytes.data(), s.bytes.size()));

  // Section offsets depend on the header length, which depends on the digits
  // of the offsets. Both only grow, so iterating from 0 reaches the smallest
  // fixed point in a few rounds.
  std::vector<uint64_t> offsets(sections_.size());
  std::string text;
  uint64_t header_len = 0;
  for (int round = 0;; ++round) {
    if (round == 16) fail_runtime(where, ": bundle header layout did not converge");
    uint64_t cursor = kBundlePrefixSize + header_len + kBundleHeaderDigestSize;
    json secs = json::object();
    for (size_t i = 0; i < sections_.size(); ++i) {
      offsets[i] = align_up(cursor);
      cursor = offsets[i] + sections_[i].bytes.size();
      secs[sections_[i].name] = {{"offset", offsets[i]}, {"length", sections_[i].bytes.size()}, {"sha256", digests[i]}};
    }
    json h = {{"format", info_.format},   {"kiln_version", info_.kiln_version}, {"family", info_.family},
              {"task", info_.task},       {"backend", info_.backend},           {"sections", secs}};
    try {
      text = h.dump();
    } catch (const json::exception& e) {  // invalid UTF-8 in a string field
      fail_runtime(where, ": cannot encode bundle header: ", e.what());
    }
    if (text.size() == header_len) break;
    header_len = text.size();
  }
  if (header_len > kBundleMaxHeaderSize) fail_runtime(where, ": bundle header too large (", header_len, " bytes)");

  Layout l;
  l.offsets = std::move(offsets);
  l.head.resize(kBundlePrefixSize + header_len);
  std::memcpy(l.head.data(), kMagic, 8);
  put_u64_le(l.head.data() + 8, header_len);
  std::memcpy(l.head.data() + kBundlePrefixSize, text.data(), text.size());
  const auto digest = sha256(l.head.data(), l.head.size());
  l.head.insert(l.head.end(), digest.begin(), digest.end());
  return l;
}

void BundleWriter::write(const std::filesystem::path& path) const {
  const Layout l = layout(path.string());
  write_file_atomic(path, [&](std::FILE* f) {
    static const uint8_t kZeros[kBundleAlignment] = {};
    write_all(f, l.head.data(), l.head.size());
    uint64_t cursor = l.head.size();
    for (size_t i = 0; i < sections_.size(); ++i) {
      write_all(f, kZeros, l.offsets[i] - cursor);
      write_all(f, sections_[i].bytes.data(), sections_[i].bytes.size());
      cursor = l.offsets[i] + sections_[i].bytes.size();
    }
  });
}

std::vector<uint8_t> BundleWriter::to_bytes() const {
  Layout l = layout("bundle writer");
  std::vector<uint8_t> out = std::move(l.head);
  for (size_t i = 0; i < sections_.size(); ++i) {
    out.resize(l.offsets[i], 0);
    out.insert(out.end(), sections_[i].bytes.begin(), sections_[i].bytes.end());
  }
  return out;
}

// ---------------------------------------------------------------- reader

// Copied, not mapped: a bundle rewritten or truncated while an engine uses it
// must not turn into SIGBUS (the CPU backend reads weights in place).
Bundle Bundle::open(const std::filesystem::path& path) { return from_bytes(read_file_blob(path), path.string()); }

Bundle Bundle::from_bytes(Blob bytes, const std::string& label) {
  Bundle b;
  b.path_ = label;
  b.map_ = std::move(bytes);
  const std::string& where = label;
  const uint8_t* p = b.map_.data;
  const uint64_t size = b.map_.size;

  if (size < kBundlePrefixSize)
    fail_input(where, ": not a kiln bundle (file is ", size, " bytes, shorter than the 16-byte prefix)");
  if (std::memcmp(p, kMagic, 8) != 0) fail_input(where, ": not a kiln bundle (bad magic)");
  const uint64_t header_len = get_u64_le(p + 8);
  if (header_len == 0) fail_input(where, ": header length is 0");
  if (header_len > kBundleMaxHeaderSize)
    fail_input(where, ": header length ", header_len, " exceeds the limit of ", kBundleMaxHeaderSize, " bytes");
  if (header_len > size - kBundlePrefixSize)
    fail_input(where, ": header length ", header_len, " runs beyond the end of the file (", size, " bytes)");

  b.header_ = parse_header_json(where, p + kBundlePrefixSize, header_len);
  const json& h = b.header_;

  // The version decides how to read everything else, so it is checked before
  // anything a newer format may have changed (digest, keys, sections).
  if (!h.contains("format")) fail_input(where, ": header: missing key 'format'");
  const json& fmt = h.at("format");
  if (!fmt.is_number_integer()) fail_input(where, ": header key 'format' must be an integer, got ", fmt.dump());
  if (fmt.is_number_unsigned() && fmt.get<uint64_t>() > static_cast<uint64_t>(kBundleFormat))
    fail_input(where, ": bundle format ", fmt.get<uint64_t>(), " is newer than this kiln supports (", kBundleFormat,
               "); rebuild it or upgrade kiln");
  if (fmt.get<int64_t>() < 1) fail_input(where, ": bundle format ", fmt.get<int64_t>(), " is invalid (must be >= 1)");

  const uint64_t json_end = kBundlePrefixSize + header_len;
  const uint64_t header_end = json_end + kBundleHeaderDigestSize;
  if (header_end > size) fail_input(where, ": header digest runs beyond the end of the file (file truncated)");
  const auto digest = sha256(p, json_end);
  if (std::memcmp(digest.data(), p + json_end, kBundleHeaderDigestSize) != 0)
    fail_input(where, ": header is corrupt: sha256 mismatch (file damaged or modified)");

  check_keys(where, h, kTopKeys, "header: ");
  b.info_.format = static_cast<int>(fmt.get<int64_t>());
  b.info_.kiln_version = get_string_field(where, h, "kiln_version");
  b.info_.family = get_string_field(where, h, "family");
  b.info_.task = get_string_field(where, h, "task");
  b.info_.backend = get_string_field(where, h, "backend");
  if (!is_valid_task(b.info_.task))
    fail_input(where, ": header key 'task' must be \"classification\" or \"detection\", got \"", b.info_.task, "\"");
  if (!is_valid_backend(b.info_.backend))
    fail_input(where, ": header key 'backend' must be \"cpu\" or \"cuda\", got \"", b.info_.backend, "\"");

  const json& secs = h.at("sections");
  if (!secs.is_object()) fail_input(where, ": header key 'sections' must be an object, got ", secs.dump());
  struct Entry {
    std::string name;
    Extent ext;
    std::string sha;
  };
  std::vector<Entry> entries;
  for (const auto& [name, s] : secs.items()) {
    const std::string ctx = cat("section '", name, "': ");
    if (!is_valid_section_name(name))
      fail_input(where, ": invalid section name '", name, "' (allowed: [A-Za-z0-9._-], 1 to ", kBundleMaxSectionName,
                 " characters)");
    if (!s.is_object()) fail_input(where, ": ", ctx, "must be an object, got ", s.dump());
    check_keys(where, s, kSectionKeys, ctx);
    Entry e{name, {get_u64_field(where, s, "offset", ctx), get_u64_field(where, s, "length", ctx)}, ""};
    if (!s.at("sha256").is_string() || !is_lower_hex64(s.at("sha256").get<std::string>()))
      fail_input(where, ": ", ctx, "'sha256' must be 64 lower-case hex digits, got ", s.at("sha256").dump());
    e.sha = s.at("sha256").get<std::string>();
    if (e.ext.offset < header_end)
      fail_input(where, ": ", ctx, "offset ", e.ext.offset, " lies inside the header (which ends at ", header_end, ")");
    if (e.ext.offset % kBundleAlignment != 0)
      fail_input(where, ": ", ctx, "offset ", e.ext.offset, " is not ", kBundleAlignment, "-byte aligned");
    // Written as a subtraction so a huge length cannot wrap around.
    if (e.ext.offset > size || e.ext.length > size - e.ext.offset)
      fail_input(where, ": ", ctx, "offset ", e.ext.offset, " + length ", e.ext.length,
                 " runs beyond the end of the file (", size, " bytes)");
    entries.push_back(std::move(e));
  }

  // Walk the file in offset order (empty sections first on ties) so that
  // overlaps are found and every byte between sections is checked to be zero:
  // together with the digests, no byte of the file goes unchecked.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.ext.offset != b.ext.offset ? a.ext.offset < b.ext.offset : a.ext.length < b.ext.length;
  });
  uint64_t cursor = header_end;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.ext.offset < cursor)
      fail_input(where, ": section '", e.name, "' overlaps section '", prev->name, "'");
    for (uint64_t i = cursor; i < e.ext.offset; ++i)
      if (p[i] != 0) fail_input(where, ": non-zero padding byte at offset ", i, " (file damaged or modified)");
    cursor = e.ext.offset + e.ext.length;
    prev = &e;
  }
  if (cursor != size)
    fail_input(where, ": ", size - cursor, " unexpected trailing bytes after offset ", cursor,
               " (file damaged or modified)");

  for (const Entry& e : entries) {
    if (sha256_hex(p + e.ext.offset, e.ext.length) != e.sha)
      fail_input(where, ": section '", e.name, "' is corrupt: sha256 mismatch (file damaged or modified)");
    b.sections_[e.name] = e.ext;
  }
  return b;
}

Blob Bundle::section(const std::string& name) const {
  auto it = sections_.find(name);
  if (it == sections_.end()) {
    std::string names;
    for (const auto& [n, e] : sections_) names += (names.empty() ? "" : ", ") + n;
    fail_input(path_.string(), ": bundle has no section '", name, "' (it has: ", names.empty() ? "none" : names, ")");
  }
  Blob b;
  b.owner = map_.owner;
  b.data = map_.data + it->second.offset;
  b.size = static_cast<size_t>(it->second.length);
  return b;
}

std::string Bundle::section_text(const std::string& name) const {
  Blob b = section(name);
  return std::string(reinterpret_cast<const char*>(b.data), b.size);
}

std::vector<std::string> Bundle::section_names() const {
  std::vector<std::string> names;
  for (const auto& [n, e] : sections_) names.push_back(n);
  return names;
}

}  // namespace kiln
