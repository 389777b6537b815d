// NumPy .npy files (format versions 1.0, 2.0, 3.0) for reference tensors,
// calibration data and debugging dumps.
//
// Only little-endian, C-order arrays of '<f4', '<f2', '<i8', '<i4' and '|u1'
// are accepted (F32, F16, I64, I32, U8); everything else is an Error(Input)
// that names the file and the problem. The header parser is a strict subset of
// the Python dict literal numpy writes, not a general Python evaluator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace kiln {

// Maps the file; the tensor points into the mapping when the data is aligned
// to 16 bytes (numpy >= 1.x pads headers to 16 or 64), otherwise it is copied.
HostTensor read_npy(const std::filesystem::path& path);
// Copies the data; `name_for_errors` starts every error message.
HostTensor read_npy_bytes(const uint8_t* data, size_t size, const std::string& name_for_errors);
// Version 1.0, header padded so the data starts at a multiple of 64, written
// atomically. Error(Runtime) for dtypes numpy has no type for (bf16, fp8).
void write_npy(const std::filesystem::path& path, const HostTensor& t);
// The bytes write_npy would write.
std::vector<uint8_t> encode_npy(const HostTensor& t);

}  // namespace kiln
