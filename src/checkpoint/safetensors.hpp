// Reader for Hugging Face safetensors checkpoints (single file or sharded with
// model.safetensors.index.json). The files are untrusted input: every header
// field is validated before any byte of tensor data is referenced, and every
// failure is an Error(Input) naming the file and, where relevant, the tensor.
// Tensors borrow from the memory mapping (the Blob owner keeps it alive).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace kiln {

// Cap on the JSON header; real headers are well under 10 MB, and the cap keeps
// a hostile length field from making us parse (or allocate for) gigabytes.
inline constexpr uint64_t kSafetensorsMaxHeader = 100ull * 1024 * 1024;

// One parsed .safetensors file.
struct SafetensorsFile {
  std::filesystem::path path;
  Blob mapping;                                 // the whole file
  std::map<std::string, HostTensor> tensors;    // borrow from `mapping`
  std::map<std::string, std::string> metadata;  // "__metadata__", empty if absent
};

// Parses bytes already in memory; `label` names the source in error messages.
// Tensor blobs share ownership of `bytes`.
SafetensorsFile parse_safetensors(const Blob& bytes, const std::string& label);
// Maps and parses a file.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

// model.safetensors.index.json: tensor name -> shard file name (a plain file
// name beside the index, checked). `label` names the source in errors.
std::map<std::string, std::string> parse_safetensors_index(const uint8_t* data, size_t size, const std::string& label);

// A set of tensors from one model.safetensors or from the shards listed in
// model.safetensors.index.json.
class Checkpoint {
 public:
  // path: a directory (uses model.safetensors, else model.safetensors.index.json,
  // else the single *.safetensors file), a .safetensors file, or an index .json.
  static Checkpoint open(const std::filesystem::path& path);

  bool has(const std::string& name) const;
  // Error(Input) "tensor 'x' not found in <source>" if missing.
  const HostTensor& get(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  // The weight files, in the order opened (shards in name order).
  const std::vector<std::filesystem::path>& files() const { return files_; }
  // File name (no directory) holding `name`; Error(Input) if missing.
  std::string file_of(const std::string& name) const;
  // File name -> SHA-256 hex of its bytes (for provenance). Hashes on each call.
  std::map<std::string, std::string> file_sha256() const;
  // "__metadata__" of each file, keyed by file name.
  const std::map<std::string, std::map<std::string, std::string>>& metadata() const { return metadata_; }
  // What open() was given after directory resolution (a .safetensors or index file).
  const std::filesystem::path& source() const { return source_; }

 private:
  struct Entry {
    HostTensor tensor;
    size_t file_index = 0;
  };
  void add_file(SafetensorsFile&& f);

  std::filesystem::path source_;
  std::vector<std::filesystem::path> files_;
  std::vector<Blob> mappings_;  // parallel to files_
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::map<std::string, std::string>> metadata_;
};

}  // namespace kiln
