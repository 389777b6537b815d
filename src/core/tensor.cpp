#include "core/tensor.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace kiln {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

Blob Blob::from_vector(std::vector<uint8_t> bytes) {
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  Blob b;
  b.data = owner->data();
  b.size = owner->size();
  b.owner = owner;
  return b;
}

Blob Blob::copy_of(const void* data, size_t size) {
  std::vector<uint8_t> v(size);
  if (size) std::memcpy(v.data(), data, size);
  return from_vector(std::move(v));
}

std::vector<float> HostTensor::to_f32() const {
  const int64_t n = numel();
  if (blob.size < nbytes()) fail_runtime("tensor of shape ", shape_str(shape), " has only ", blob.size, " bytes");
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = blob.data;
  switch (dtype) {
    case DType::F32:
      if (n) std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::F8E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(p[i]);
      break;
    case DType::F8E5M2:
      for (int64_t i = 0; i < n; ++i) out[i] = e5m2_to_f32(p[i]);
      break;
    // Integers convert exactly up to 2^24 (indices, quantized codes).
    case DType::U8:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
      break;
    case DType::I8:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<int8_t>(p[i]));
      break;
    case DType::I32:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = static_cast<float>(v);
      }
      break;
    case DType::I64:
      for (int64_t i = 0; i < n; ++i) {
        int64_t v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      break;
    default:
      fail_input("cannot convert a ", dtype_name(dtype), " tensor to f32");
  }
  return out;
}

HostTensor HostTensor::from_f32(const Shape& shape, const std::vector<float>& values) {
  return from_f32_as(DType::F32, shape, values);
}

HostTensor HostTensor::from_f32_as(DType dtype, const Shape& shape, const std::vector<float>& values) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = shape;
  const size_t n = values.size();
  if (static_cast<int64_t>(n) != shape_numel(shape))
    fail_runtime("from_f32_as: ", n, " values for shape ", shape_str(shape));
  std::vector<uint8_t> bytes(n * dtype_size(dtype));
  switch (dtype) {
    case DType::F32:
      if (n) std::memcpy(bytes.data(), values.data(), n * 4);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_f16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_bf16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
      break;
    case DType::F8E4M3:
      for (size_t i = 0; i < n; ++i) bytes[i] = f32_to_e4m3(values[i]);
      break;
    case DType::F8E5M2:
      for (size_t i = 0; i < n; ++i) bytes[i] = f32_to_e5m2(values[i]);
      break;
    case DType::I8:  // int8 codes: every value must already be an integer in [-128, 127]
      for (size_t i = 0; i < n; ++i) {
        const float v = values[i];
        if (!(v >= -128.f && v <= 127.f) || v != std::nearbyint(v))
          fail_runtime("from_f32_as: ", v, " at ", i, " is no int8 value");
        bytes[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
      }
      break;
    default:
      fail_runtime("from_f32_as: unsupported dtype ", dtype_name(dtype));
  }
  t.blob = Blob::from_vector(std::move(bytes));
  return t;
}

}  // namespace kiln
