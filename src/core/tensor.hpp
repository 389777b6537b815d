// Host-side tensors. A Blob is a read-only byte range with an owner that keeps
// it alive (an mmapped file, a vector); tensors built from checkpoints and
// bundles point into mmapped files without copying.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace kiln {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[1,3,224,224]"

struct Blob {
  std::shared_ptr<const void> owner;
  const uint8_t* data = nullptr;
  size_t size = 0;

  static Blob from_vector(std::vector<uint8_t> bytes);
  static Blob copy_of(const void* data, size_t size);
};

// A dense, row-major host tensor (owning or borrowing through Blob).
struct HostTensor {
  DType dtype = DType::F32;
  Shape shape;
  Blob blob;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Converts any float dtype to fp32 values (throws for non-float).
  std::vector<float> to_f32() const;
  static HostTensor from_f32(const Shape& shape, const std::vector<float>& values);
  // Converts f32 values into `dtype` storage with round-to-nearest-even.
  static HostTensor from_f32_as(DType dtype, const Shape& shape, const std::vector<float>& values);
};

}  // namespace kiln
