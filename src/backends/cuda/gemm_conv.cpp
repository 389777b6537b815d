// kiln's GEMM conv (gemm_conv.hpp): its rules, its op (im2col + LinearOp)
// and its lowering pieces, which lower_Conv2d (conv.cpp) calls.
#include "backends/cuda/gemm_conv.hpp"

#include <climits>
#include <cstdint>

#include "backends/cuda/lower.hpp"
#include "core/error.hpp"

namespace kiln::cuda {

namespace {

int64_t gemm_rows(const ConvDesc& d) { return int64_t(d.n) * d.out_h() * d.out_w(); }
int64_t gemm_depth(const ConvDesc& d) { return int64_t(d.r) * d.s * d.c; }

// d's im2col geometry, once gemm_conv_unsupported has no objection (throws its reason).
Im2colShape checked_geometry(const ConvDesc& d) {
  if (const std::string why = gemm_conv_unsupported(d); !why.empty()) fail_runtime("cuda gemm_conv: ", why);
  return {d.n,        d.h,        d.w,     d.c,     d.r,     d.s,     d.out_h(),
          d.out_w(),  d.stride_h, d.stride_w, d.pad_t, d.pad_l, d.dil_h, d.dil_w};
}

}  // namespace

bool gemm_conv_in_place(const ConvDesc& d) {
  return d.r == 1 && d.s == 1 && d.stride_h == 1 && d.stride_w == 1 && d.pad_t == 0 && d.pad_l == 0 && d.pad_b == 0 &&
         d.pad_r == 0;
}

size_t gemm_conv_cols_bytes(const ConvDesc& d) {
  return gemm_conv_in_place(d) ? 0 : size_t(gemm_rows(d)) * size_t(gemm_depth(d)) * dtype_size(d.dtype);
}

std::string gemm_conv_unsupported(const ConvDesc& d) {
  if (d.fp8 || d.fp8_epi.on) return "an 8-bit conv (the quantized layer's paths run it)";
  if (d.dtype != DType::F16 && d.dtype != DType::BF16 && d.dtype != DType::F32) return cat("dtype ", dtype_name(d.dtype));
  if (d.groups != 1) return cat("groups ", d.groups, " (a GEMM takes groups 1)");
  if ((d.x_stride != 0 && d.x_stride != d.c) || (d.y_stride != 0 && d.y_stride != d.k))
    return cat("pixel strides x ", d.x_stride, " y ", d.y_stride, " (channel windows; a GEMM takes dense x and y)");
  if (d.n < 1 || d.c < 1 || d.k < 1 || d.r < 1 || d.s < 1 || d.out_h() < 1 || d.out_w() < 1) return "an empty conv";
  if (gemm_rows(d) > INT_MAX || gemm_depth(d) > INT_MAX) return cat("a GEMM of ", gemm_rows(d), " x ", gemm_depth(d), " (past int)");
  if (const size_t bytes = gemm_conv_cols_bytes(d); bytes > kMaxIm2colBytes)
    return cat("an im2col matrix of ", bytes, " bytes (at most ", kMaxIm2colBytes, ")");
  return "";
}

std::string gemm_conv_tactic_name(const std::string& algo) { return kGemmConvTactic + algo; }

std::optional<std::string> parse_gemm_conv_tactic(const std::string& name) {
  const std::string prefix = kGemmConvTactic;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  return name.substr(prefix.size());
}

GemmConvOp::GemmConvOp(cublasLtHandle_t handle, const ConvDesc& d)
    : geo_(checked_geometry(d)),
      dt_(d.dtype),
      act_(d.act),
      im2col_(!gemm_conv_in_place(d)),
      cols_bytes_(align256(gemm_conv_cols_bytes(d))),
      lt_(handle, d.dtype, int(gemm_rows(d)), int(gemm_depth(d)), d.k, d.has_bias, d.act, d.allow_tf32, std::nullopt,
          d.has_residual) {}

int GemmConvOp::find(const std::string& name) const {
  for (int i = 0; i < tactic_count(); ++i)
    if (tactic_name(i) == name) return i;
  return -1;
}

std::string GemmConvOp::step_name() const {
  const bool act_kernel = act_ != Activation::None && act_ != Activation::Relu;  // LinearOp's kernel after the GEMM
  return cat(tactic_name(selected()), im2col_ ? " +im2col" : "", act_kernel ? cat(" +", activation_name(act_), " kernel") : "");
}

void GemmConvOp::run(const void* x, const void* w, const void* bias, const void* residual, void* y, void* workspace,
                     size_t workspace_size, cudaStream_t s) const {
  if (workspace_size < workspace_bytes())
    fail_runtime("cuda gemm_conv: needs ", workspace_bytes(), " bytes of workspace, got ", workspace_size);
  const void* a = x;
  if (im2col_) {
    im2col_nhwc(x, workspace, dt_, geo_, s);
    a = workspace;
  }
  lt_.run(a, w, bias, y, static_cast<char*>(workspace) + cols_bytes_, workspace_size - cols_bytes_, s, residual);
}

bool gemm_conv_on(const Lowering& L, const ConvDesc& d) {
  return L.m.opts.switches.get(Switch::GemmConv).value_or(false) && gemm_conv_unsupported(d).empty();
}

std::shared_ptr<GemmConvOp> gemm_conv_op(const Lowering& L, const ConvDesc& d) {
  if (!gemm_conv_on(L, d)) return nullptr;
  try {
    return std::make_shared<GemmConvOp>(L.m.lt.h, d);
  } catch (const Error&) {
    return nullptr;  // cuBLASLt offers no algorithm: cuDNN's engines alone
  }
}

void gemm_conv_step(Lowering& L, const Node& n, std::shared_ptr<const GemmConvOp> op) {
  const void* w = L.weight(n.inputs[1]);
  const void* b = n.inputs.size() > 2 ? L.weight(n.inputs[2]) : nullptr;
  const int in0 = n.inputs[0], out = n.outputs[0], res = n.inputs.size() > 3 ? n.inputs[3] : -1;
  L.reserve_workspace(op->workspace_bytes());  // the side lane's workspace has the program's size too
  const ValuePtr ptr = L.ptr;
  L.step(op->step_name(), [=](const Exec& x) {
    op->run(ptr(x, in0), w, b, res >= 0 ? ptr(x, res) : nullptr, ptr(x, out), x.workspace, x.workspace_bytes, x.stream);
  });
}

bool lower_recorded_gemm_conv(Lowering& L, const Node& n, const ConvDesc& d, const std::string& recorded) {
  if (!parse_gemm_conv_tactic(recorded)) return false;
  // A recorded plan replays exactly or not at all: no silent fallback to another tactic.
  const auto fail = [&](const std::string& why) {
    fail_input("conv ", n.name, ": the bundle records tactic '", recorded, "' but ", why, "; rebuild the bundle");
  };
  if (!L.m.opts.switches.get(Switch::GemmConv).value_or(false)) fail("switch gemm_conv is off");
  if (const std::string why = gemm_conv_unsupported(d); !why.empty()) fail("the GEMM conv does not take " + why);
  std::shared_ptr<GemmConvOp> op;
  try {
    op = std::make_shared<GemmConvOp>(L.m.lt.h, d);
  } catch (const Error& e) {
    fail(e.what());
  }
  const int i = op->find(recorded);
  if (i < 0) fail(cat("cuBLASLt's heuristic offers no such algorithm here (", op->tactic_count(), " others)"));
  op->select(i);
  L.record(n.name, recorded, -1.f);
  gemm_conv_step(L, n, op);
  return true;
}

}  // namespace kiln::cuda
