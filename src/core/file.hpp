// Read-only memory-mapped files, SHA-256, and atomic writes (temp file beside
// the target, fsync, rename) so a failure never leaves a partial output.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace kiln {

// Maps the whole file; the returned Blob keeps the mapping alive. Empty files
// give an empty Blob. Throws Error(Input) naming the path when it cannot be read.
Blob map_file(const std::filesystem::path& path);
// Reads the whole file into memory it owns (64-byte aligned). Unlike a
// mapping, the Blob is immune to the file being truncated or rewritten later
// (a mapped page of a truncated file raises SIGBUS when touched). A file that
// changes size while it is read is refused with Error(Input).
Blob read_file_blob(const std::filesystem::path& path);
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path);

std::array<uint8_t, 32> sha256(const void* data, size_t size);
std::string sha256_hex(const void* data, size_t size);
std::string sha256_file_hex(const std::filesystem::path& path);

// Calls `write` with a stream to a temporary file in the target's directory,
// then renames it over `target`. On any exception the temp file is removed
// and the target is untouched.
void write_file_atomic(const std::filesystem::path& target,
                       const std::function<void(std::FILE*)>& write);
// fwrite that throws on short writes.
void write_all(std::FILE* f, const void* data, size_t size);

}  // namespace kiln
