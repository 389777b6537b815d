// The CUDA runner: the case graph goes through CudaEngine + CudaContext, the
// path Engine::load and ExecutionContext::run take (tactic selection at the
// requested opt level, NHWC layout, the SE and window-conv plans, CUDA-graph
// capture). Compiled only in CUDA builds.
#include "op_harness.hpp"

#ifdef KILN_HAVE_CUDA
#include <memory>

#include "backends/cuda/cuda_engine.hpp"
#include "backends/cuda/fp8_gemm_sm90.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"

namespace kiln::ops {

bool cuda_available() {
  std::string why;
  return cuda::device_available(&why);
}

bool cutlass_fp8_available() {
  return cuda_available() && cuda::fp8_gemm_sm90_configs() > 0 &&
         cuda::fp8_gemm_sm90_unsupported(0, DType::F8E4M3, 16, 16, 16, false, DType::F16, DType::F16, Activation::None).empty();
}

std::vector<ref::Buffer> run_cuda_backend(const Graph& g, const std::vector<ref::Buffer>& inputs, int opt_level,
                                          int perf_runs, double* median_ms, int fp8_fusion, std::string* tactics) {
  const int64_t batch = g.values[g.inputs.at(0)].shape.at(0);
  for (int v : g.inputs)  // ExecutionContext::run's check: one batch size for all inputs
    if (g.values[v].shape.at(0) != batch) fail_input("inputs disagree on the batch size");
  // As `kiln build` takes a graph: the backend's supports() check first (a
  // graph it cannot run is refused there, naming the node, before lowering),
  // then tactics timed at opt level >= 3, no tactic
  // cache (each case is timed on its own, whatever earlier runs chose).
  if (const std::string why = cuda::lowering_refusal(g); !why.empty()) fail_input(why);
  cuda::CudaOptions o;
  o.opt_level = opt_level;
  o.tune = true;
  o.switches.set(Switch::FuseMlp, true);  // every mlp_chain form, the norm inside included (auto: chains alone)
  o.switches.set(Switch::IgemmConv, true);  // kiln's implicit-GEMM conv timed beside cuDNN's engines (auto: off)
  o.switches.set(Switch::GemmConv, true);   // kiln's GEMM conv (im2col + cuBLASLt) timed beside them (auto: off)
  o.switches.set(Switch::LinearNorm, true);  // small_gemm_norm wherever it takes a post-norm (auto: off until measured)
  o.switches.set(Switch::ConcatMask, true);  // a concat's per-token mask mul inside its launch (auto: off until measured)
  o.switches.set(Switch::Sm90Conv, true);    // kiln's sm90 conv (CUTLASS TMA + wgmma) timed beside cuDNN's engines (auto: off)
  o.switches.set(Switch::DirectConv, true);  // kiln's direct conv for <= 4 input channels timed beside them (auto: off)
  o.switches.set(Switch::ClusterTopK, true);  // top_k rows of 4096..196608 on a cluster of 8 blocks (auto: on)
  o.switches.set(Switch::WideAttention, true);  // attention's split-4 form with 2 or 4 query groups a block (auto: on)
  o.switches.set(Switch::WarpDeform, true);  // ms_deform_attn's warp form (auto: from 2400 queries a launch)
  o.switches.set(Switch::MemsetKernels, true);  // captured memset nodes (cuDNN's) as fill kernels (auto: off)
  o.fp8_fusion = fp8_fusion == 2  ? cuda::Fp8Fusion::Cutlass
                 : fp8_fusion > 0 ? cuda::Fp8Fusion::Fused
                 : fp8_fusion < 0 ? cuda::Fp8Fusion::Unfused
                                  : cuda::Fp8Fusion::Auto;
  auto engine = std::make_shared<cuda::CudaEngine>(g, o);
  if (tactics) {
    const nlohmann::json t = engine->tactics_json();
    tactics->clear();
    if (t.contains("layers"))
      for (const auto& [node, rec] : t["layers"].items())
        if (rec.is_object() && rec.contains("tactic")) *tactics += node + ": " + rec["tactic"].get<std::string>() + "; ";
  }
  cuda::CudaContext ctx(engine);
  std::vector<Tensor> tensors;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Value& v = g.values[g.inputs[k]];
    tensors.push_back({v.name, v.shape, inputs[k]});
  }
  std::vector<const Tensor*> given;
  for (const Tensor& t : tensors) given.push_back(&t);
  std::vector<ref::Buffer> out;
  for (Tensor& t : ctx.run(given, batch)) out.push_back(std::move(t.data));
  if (perf_runs > 0 && median_ms) {
    std::vector<double> ms;
    for (int r = 0; r < perf_runs; ++r) ms.push_back(ctx.timed_replay_ms(batch));
    *median_ms = median(ms);
  }
  return out;
}

}  // namespace kiln::ops

#else

namespace kiln::ops {
bool cuda_available() { return false; }
bool cutlass_fp8_available() { return false; }
}  // namespace kiln::ops

#endif
