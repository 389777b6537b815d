// The kiln bundle container (docs/bundle-format.md is normative): a magic, a
// JSON header, a header digest and 64-byte aligned named sections, each with
// its own sha256. This file knows nothing about what the sections contain.
//
// A Bundle is validated completely in open() — bounds, digests, versions, and
// that every byte of the file is accounted for — so code that reads sections
// afterwards can trust them without re-checking.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.hpp"

namespace kiln {

// Bump for any change an older reader would misread (see the doc's version rule).
constexpr int kBundleFormat = 1;
// Magic, then a little-endian u64 header length.
constexpr size_t kBundlePrefixSize = 16;
// A SHA-256 of bytes [0, 16 + H) follows the JSON so that every header byte
// (including free-form strings such as "family") is covered by a digest.
constexpr size_t kBundleHeaderDigestSize = 32;
constexpr size_t kBundleAlignment = 64;
constexpr uint64_t kBundleMaxHeaderSize = 16ull << 20;
constexpr size_t kBundleMaxSectionName = 128;

struct BundleInfo {
  int format = kBundleFormat;
  std::string kiln_version, family, task, backend;
};

// [A-Za-z0-9._-]+, at most kBundleMaxSectionName characters.
bool is_valid_section_name(const std::string& name);

class BundleWriter {
 public:
  // Throws Error(Runtime) for a format other than kBundleFormat or a task /
  // backend the reader would reject: a writer must never produce a bundle
  // that it cannot read back.
  explicit BundleWriter(BundleInfo info);
  // Duplicate or invalid name -> Error(Runtime). Sections are laid out in the
  // order they are added.
  void add_section(const std::string& name, std::vector<uint8_t> bytes);
  void add_section(const std::string& name, const std::string& text);
  // Atomic (temp file beside the target, then rename); on failure the target
  // is untouched and no temp file is left behind.
  void write(const std::filesystem::path& path) const;
  // The bytes write() would put in the file (for in-memory use and tests).
  std::vector<uint8_t> to_bytes() const;

 private:
  struct Pending {
    std::string name;
    std::vector<uint8_t> bytes;
  };
  // Magic + length + header JSON + header digest, and each section's offset.
  struct Layout {
    std::vector<uint8_t> head;
    std::vector<uint64_t> offsets;
  };
  Layout layout(const std::string& where) const;
  BundleInfo info_;
  std::vector<Pending> sections_;
};

// Read side; immutable after open, safe to share between threads. Copies
// share the bytes, which open() reads into memory (the file may change later).
class Bundle {
 public:
  // Validates everything before returning; every problem is an Error(Input)
  // whose message starts with the path.
  static Bundle open(const std::filesystem::path& path);
  // The same checks on bytes already in memory (the Blob's owner is kept
  // alive by every section view); `label` stands for the path in messages
  // and in path().
  static Bundle from_bytes(Blob bytes, const std::string& label);

  const BundleInfo& info() const { return info_; }
  const nlohmann::json& header() const { return header_; }
  bool has_section(const std::string& name) const { return sections_.count(name) != 0; }
  // Zero-copy view into the bundle's bytes (the Blob keeps them alive). Error(Input)
  // naming the bundle and the section if absent.
  Blob section(const std::string& name) const;
  std::string section_text(const std::string& name) const;
  // Sorted by name.
  std::vector<std::string> section_names() const;
  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return map_.size; }

 private:
  struct Extent {
    uint64_t offset = 0, length = 0;
  };
  std::filesystem::path path_;
  Blob map_;
  nlohmann::json header_;
  BundleInfo info_;
  std::map<std::string, Extent> sections_;
};

}  // namespace kiln
