// kiln's depthwise convolution kernel against the CPU reference conv2d
// (groups == channels), f32/f16/bf16, awkward shapes, TF "same" asymmetric
// padding, stride 2, bias/residual/activation epilogues. Error measure:
// max |got - ref| / max(1, |ref|) with inputs rounded to the storage type;
// f32 1e-5, f16 2e-3, bf16 1.6e-2 (elementwise_tol: one rounding of the output).
#include <gtest/gtest.h>

#include "backends/cpu/kernels.hpp"
#include "backends/cuda/kernels.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

struct Case {
  int n, c, h, w, k, stride, pad_t, pad_l, pad_b, pad_r;
  bool bias, residual;
  Activation act;
};

TEST(CudaDepthwise, MatchesCpuReference) {
  KILN_REQUIRE_GPU();
  const Case cases[] = {
      {1, 13, 17, 13, 3, 1, 1, 1, 1, 1, true, false, Activation::Silu},
      {3, 32, 9, 9, 3, 2, 1, 1, 1, 1, true, false, Activation::Relu6},
      {1, 144, 14, 14, 5, 1, 2, 2, 2, 2, true, true, Activation::None},
      {2, 24, 8, 10, 3, 2, 0, 0, 1, 1, true, false, Activation::Silu},  // TF "same", even size
      {1, 40, 1, 1, 3, 1, 1, 1, 1, 1, false, false, Activation::Sigmoid},
      {3, 8, 7, 5, 5, 2, 1, 2, 2, 1, true, true, Activation::Relu},
  };
  for (DType dt : kFloatTypes)
    for (const Case& t : cases) {
      cpu::Conv2dParams p;
      p.n = t.n, p.c_in = t.c, p.h = t.h, p.w = t.w, p.c_out = t.c, p.kh = t.k, p.kw = t.k;
      p.stride_h = p.stride_w = t.stride, p.pad_t = t.pad_t, p.pad_l = t.pad_l, p.pad_b = t.pad_b, p.pad_r = t.pad_r;
      p.groups = t.c;
      const int oh = p.out_h(), ow = p.out_w();
      const auto x = round_all(random_values(size_t(t.n) * t.c * t.h * t.w, 31), dt);
      const auto w = round_all(random_values(size_t(t.c) * t.k * t.k, 32, -0.5f, 0.5f), dt);
      const auto b = round_all(random_values(size_t(t.c), 33), dt);
      const auto r = round_all(random_values(size_t(t.n) * t.c * oh * ow, 34), dt);
      std::vector<float> ref(size_t(t.n) * t.c * oh * ow);
      cpu::conv2d(p, x.data(), w.data(), t.bias ? b.data() : nullptr, t.residual ? r.data() : nullptr, t.act, ref.data(),
                  cpu::default_pool());
      const auto dx = upload(nchw_to_nhwc(x, t.n, t.c, t.h, t.w), dt);
      const auto dw = upload(depthwise_weights_tap_major(w.data(), t.c, t.k, t.k), dt);
      const auto db = upload(b, dt);
      const auto dr = upload(nchw_to_nhwc(r, t.n, t.c, oh, ow), dt);
      const auto dy = alloc(ref.size(), dt);
      const DepthwiseShape s{t.n, t.h, t.w, t.c, oh, ow, t.k, t.k, t.stride, t.stride, t.pad_t, t.pad_l, 1, 1};
      depthwise_conv_nhwc(dx->ptr(), dw->ptr(), t.bias ? db->ptr() : nullptr, t.residual ? dr->ptr() : nullptr, dy->ptr(), dt,
                          s, t.act, nullptr);
      expect_close(download(dy->ptr(), ref.size(), dt), round_all(nchw_to_nhwc(ref, t.n, t.c, oh, ow), dt),
                   elementwise_tol(dt) * t.k,  // k*k products accumulate: allow the sum's rounding
                   std::string(dtype_name(dt)) + " dw c" + std::to_string(t.c) + " k" + std::to_string(t.k));
    }
}

}  // namespace
}  // namespace kiln::cuda::test
