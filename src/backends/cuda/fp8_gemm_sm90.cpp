// The dispatcher of the sm90 FP8 GEMM (fp8_gemm_sm90.hpp): checks a problem
// against a configuration and the device, then calls the configuration's
// CUTLASS kernel (fp8_gemm_sm90_<tile>.cu, an sm_90a object library built only
// with CUTLASS's headers). Plain C++: no CUTLASS here.
#include "backends/cuda/fp8_gemm_sm90.hpp"


#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/fp8_gemm_sm90_impl.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

namespace fp8sm90 {

// Read once, as detail::sm_count (device_common.cuh, CUDA-only) does: kiln
// runs one GPU model per process. 0 when unknown: CUTLASS asks itself then.
int sm_count_of_current_device() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 0;
    return n;
  }();
  return sms;
}

}  // namespace fp8sm90

namespace {

#if defined(KILN_HAVE_CUTLASS)
// Appended in order: a configuration's index is part of no record (bundles
// record the name), but keeping the old ones first keeps heuristic order.
const fp8sm90::Config* const kConfigs[] = {&fp8sm90::kConfig128x128,       &fp8sm90::kConfig128x64,
                                           &fp8sm90::kConfig128x256,       &fp8sm90::kConfig128x128k64,
                                           &fp8sm90::kConfig128x64k64,     &fp8sm90::kConfig128x256k64,
                                           &fp8sm90::kConfig128x64StreamK, &fp8sm90::kConfig128x128StreamK,
                                           &fp8sm90::kConfigI8x128x128,    &fp8sm90::kConfigI8x128x64};
constexpr int kConfigCount = 10;
#else
const fp8sm90::Config* const kConfigs[] = {nullptr};
constexpr int kConfigCount = 0;
#endif

const fp8sm90::Config& config(int cfg) {
  if (cfg < 0 || cfg >= kConfigCount)
    fail_runtime("cuda fp8_gemm_sm90: configuration ", cfg, " of ", kConfigCount,
                 kConfigCount ? "" : " (built without CUTLASS's headers: tools/setup.sh)");
  return *kConfigs[cfg];
}

}  // namespace

bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

int fp8_gemm_sm90_configs() { return kConfigCount; }

const char* fp8_gemm_sm90_config_name(int cfg) { return config(cfg).name; }

DType fp8_gemm_sm90_config_code(int cfg) { return config(cfg).code; }

std::string fp8_gemm_sm90_unsupported(int cfg, DType code, int64_t m, int n, int k, bool residual, DType rdt, DType ydt,
                                      Activation act) {
  if (cfg < 0 || cfg >= kConfigCount) return cat("no configuration ", cfg, " (", kConfigCount, " built)");
  const DType c = config(cfg).code;
  if (code != c) return cat("the configuration multiplies ", dtype_name(c), " codes, the layer's are ", dtype_name(code));
  if (!device_is_sm90()) return "the device is not compute capability 9.0 (sm_90a kernels)";
  if (m <= 0 || n <= 0 || k <= 0 || m > (int64_t(1) << 31) - 1) return cat("shape [", m, ", ", k, "] x [", n, ", ", k, "]");
  if (k % 16 || n % 16) return cat("k ", k, " and n ", n, " must be multiples of 16");
  if (residual && rdt != DType::F16 && rdt != c) return cat("residual of ", dtype_name(rdt), " (f16 or ", dtype_name(c), " codes)");
  if (ydt != DType::F16 && ydt != c) return cat("output of ", dtype_name(ydt), " (f16 or ", dtype_name(c), ")");
  if (act != Activation::None && act != Activation::Relu) return "activation other than none or relu";
  return "";
}

size_t fp8_gemm_sm90_workspace(int cfg, int m, int n, int k) { return config(cfg).workspace(m, n, k); }

void fp8_gemm_sm90(int cfg, DType code, const void* x, const void* w, const QuantEpilogue& e, const void* residual, DType rdt,
                   void* y, DType ydt, int m, int n, int k, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const fp8sm90::Config& c = config(cfg);
  if (const std::string why = fp8_gemm_sm90_unsupported(cfg, code, m, n, k, residual != nullptr, rdt, ydt, e.act);
      !why.empty())
    fail_runtime("cuda fp8_gemm_sm90 (", c.name, "): ", why);
  fp8sm90::Problem p;
  p.x = x, p.w = w, p.e = &e, p.residual = residual, p.rdt = rdt, p.y = y, p.ydt = ydt;
  p.m = m, p.n = n, p.k = k, p.workspace = workspace, p.workspace_bytes = workspace_bytes, p.stream = stream;
  c.run(p);
}

}  // namespace kiln::cuda
