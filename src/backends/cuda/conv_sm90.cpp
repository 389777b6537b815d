// The dispatcher of kiln's sm90 conv (conv_sm90.hpp): checks a conv against a
// configuration and the device, then calls the configuration's CUTLASS kernel
// (conv_sm90_<tile>.cu, in the sm_90a object library built only with
// CUTLASS's headers). Plain C++: no CUTLASS here.
#include "backends/cuda/conv_sm90.hpp"

#include <cstdint>

#include "backends/cuda/conv_sm90_impl.hpp"
#include "backends/cuda/fp8_gemm_sm90.hpp"  // device_is_sm90
#include "core/error.hpp"

namespace kiln::cuda {

namespace {

#if defined(KILN_HAVE_CUTLASS)
// Order: the 64-channel-chunk tiles by size, then the 32-channel ones. A
// configuration's index is part of no record (bundles record the name).
// 128x128x64 was dropped in session 30: it was the slowest 64-channel tile on
// every r18vd shape (session 29's probe), and each tile costs ~50 s of build.
const convsm90::Config* const kConfigs[] = {&convsm90::kConv64x32x64,  &convsm90::kConv64x64x64,
                                            &convsm90::kConv128x64x64, &convsm90::kConv64x128x64,
                                            &convsm90::kConv128x32x32, &convsm90::kConv128x64x32};
constexpr int kConfigCount = 6;
#else
const convsm90::Config* const kConfigs[] = {nullptr};
constexpr int kConfigCount = 0;
#endif

const convsm90::Config& config(int cfg) {
  if (cfg < 0 || cfg >= kConfigCount)
    fail_runtime("cuda conv_sm90: configuration ", cfg, " of ", kConfigCount,
                 kConfigCount ? "" : " (built without CUTLASS's headers: tools/setup.sh)");
  return *kConfigs[cfg];
}

// The checks that need no CUTLASS: what the kernels are built for.
std::string shape_unsupported(const convsm90::Config& c, DType dt, const IgemmConvShape& s, Activation act) {
  if (dt != DType::F16) return cat("dtype ", dtype_name(dt), " (f16 only)");
  if (s.n <= 0 || s.h <= 0 || s.w <= 0 || s.c <= 0 || s.k <= 0 || s.r <= 0 || s.s <= 0 || s.out_h <= 0 || s.out_w <= 0)
    return "an empty shape";
  if (s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 || s.dil_w < 1 || s.pad_t < 0 || s.pad_l < 0)
    return cat("stride ", s.stride_h, "x", s.stride_w, " dilation ", s.dil_h, "x", s.dil_w, " padding ", s.pad_t, "/", s.pad_l);
  // TMA: every stride a multiple of 16 bytes. A tap's channels in whole K chunks of the tile: a
  // chunk reaching past c would rest on TMA's zero fill across the tap boundary, which no test covers.
  if (s.c % 8 || s.k % 8) return cat("channels ", s.c, " -> ", s.k, " (multiples of 8)");
  if (s.c % c.tile_k) return cat(s.c, " input channels, not a multiple of the tile's K chunk of ", c.tile_k);
  if ((s.x_stride && (s.x_stride < s.c || s.x_stride % 8)) || (s.y_stride && (s.y_stride < s.k || s.y_stride % 8)))
    return cat("pixel strides ", s.x_stride, "/", s.y_stride, " (multiples of 8, >= the channels)");
  if (int64_t(s.n) * s.out_h * s.out_w >= (int64_t(1) << 31) || int64_t(s.n) * s.h * s.w >= (int64_t(1) << 31))
    return "more than 2^31 pixels";
  if (act != Activation::None && act != Activation::Relu && act != Activation::Relu6 && act != Activation::Silu &&
      act != Activation::Sigmoid)
    return cat("activation ", activation_name(act));
  return "";
}

}  // namespace

int conv_sm90_configs() { return kConfigCount; }

const char* conv_sm90_config_name(int cfg) { return config(cfg).name; }

int conv_sm90_config_of(const std::string& name) {
  for (int i = 0; i < kConfigCount; ++i)
    if (name == kConfigs[i]->name) return i;
  return -1;
}

std::string conv_sm90_unsupported(int cfg, DType dt, const IgemmConvShape& s, bool residual, Activation act) {
  if (cfg < 0 || cfg >= kConfigCount) return cat("no configuration ", cfg, " (", kConfigCount, " built)");
  const convsm90::Config& c = config(cfg);
  if (std::string why = shape_unsupported(c, dt, s, act); !why.empty()) return why;
  if (!device_is_sm90()) return "the device is not compute capability 9.0 (sm_90a kernels)";
  convsm90::Problem p;
  p.s = s, p.act = act;
  // can_implement looks at the shape and the pointers' presence only: any non-null stand-in.
  alignas(16) static const char stand_in[16] = {};
  p.x = p.w = stand_in, p.y = const_cast<char*>(stand_in), p.residual = residual ? stand_in : nullptr;
  return c.unsupported(p);
}

void conv_sm90_nhwc(int cfg, const void* x, const void* w_krsc, const void* bias, const void* residual, void* y, DType dt,
                    const IgemmConvShape& s, Activation act, bool pdl, cudaStream_t stream) {
  const convsm90::Config& c = config(cfg);
  if (std::string why = shape_unsupported(c, dt, s, act); !why.empty()) fail_runtime("cuda conv_sm90 (", c.name, "): ", why);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(x) || !aligned(w_krsc) || !aligned(y) || !aligned(bias) || !aligned(residual))
    fail_runtime("cuda conv_sm90 (", c.name, "): x, w, bias, residual and y must be 16-byte aligned (TMA)");
  convsm90::Problem p;
  p.s = s, p.x = x, p.w = w_krsc, p.bias = bias, p.residual = residual, p.y = y, p.act = act, p.stream = stream, p.pdl = pdl;
  c.run(p);
}

}  // namespace kiln::cuda
