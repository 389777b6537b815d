// kiln's FP8 e4m3 kernels (quant.cu) against the CPU's bit-exact emulation:
// the device encoder is core/half.hpp's f32_to_e4m3 on every f16 value, every
// midpoint between neighbouring codes and one f32 ulp either side; the decoder
// gives every code's value; the row padding; the quantized-layer epilogue is
// quant::LayerEpilogue::apply bit for bit for the activations both sides
// compute with the same f32 operations (none, ReLU), and kiln's CUTLASS GEMM
// with that epilogue inside is too over exact sums. The engines around them
// (cuBLASLt, cuDNN) are checked by the op harness (tests/ops/cases_quant.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backends/cuda/fp8_gemm_sm90.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/lower.hpp"
#include "cuda_test_util.hpp"
#include "quant/layer.hpp"

namespace kiln::cuda::test {
namespace {

std::unique_ptr<DevBuf> upload_bytes(const void* data, size_t n) {
  auto d = std::make_unique<DevBuf>(n);
  cudaMemcpy(d->ptr(), data, n, cudaMemcpyHostToDevice);
  return d;
}

TEST(CudaFp8, EncoderIsTheCpuEncoderBitForBit) {
  KILN_REQUIRE_GPU();
  std::vector<float> x;
  for (uint32_t h = 0; h < 65536; ++h) x.push_back(f16_to_f32(static_cast<uint16_t>(h)));  // inf, NaN, subnormals too
  for (int c = 0; c < 126; ++c) {  // ties go to the even code; one ulp either side decides
    const float mid = (e4m3_to_f32(uint8_t(c)) + e4m3_to_f32(uint8_t(c + 1))) / 2;  // exact in f32
    for (float v : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1000.f)}) x.push_back(v), x.push_back(-v);
  }
  for (float v : {448.f, 463.9f, 464.f, 464.1f, 480.f, 1e30f, 0x1p-10f, 0x1p-9f, 0x1.8p-10f}) x.push_back(v), x.push_back(-v);
  const float one = 1.f;
  const auto dx = upload(x, DType::F32);
  const auto inv = upload_bytes(&one, sizeof(one));
  const auto dy = std::make_unique<DevBuf>(x.size());
  quantize_e4m3(dx->ptr(), DType::F32, dy->ptr(), int64_t(x.size()), inv->as<float>(), 1, 1, nullptr);
  const auto got = download_bytes(dy->ptr(), x.size());
  int bad = 0;
  for (size_t i = 0; i < x.size() && bad < 10; ++i) {
    if (std::isnan(x[i])) {
      EXPECT_EQ(got[i] & 0x7f, 0x7f) << "NaN " << f32_bits(x[i]) << " must stay NaN";
      continue;
    }
    const uint8_t want = f32_to_e4m3(x[i]);
    if (got[i] != want) ++bad;
    EXPECT_EQ(int(got[i]), int(want)) << "x = " << x[i] << " (bits " << std::hex << f32_bits(x[i]) << ")";
  }
}

TEST(CudaFp8, DecoderGivesEveryCodesValue) {
  KILN_REQUIRE_GPU();
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[size_t(c)] = uint8_t(c);
  const float one = 1.f;
  const auto dx = upload_bytes(codes.data(), codes.size());
  const auto sc = upload_bytes(&one, sizeof(one));
  const auto dy = alloc(256, DType::F32);
  dequantize_e4m3(dx->ptr(), dy->ptr(), DType::F32, 256, sc->as<float>(), 1, 1, nullptr);
  const auto got = download(dy->ptr(), 256, DType::F32);
  for (int c = 0; c < 256; ++c) {
    const float want = e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got[size_t(c)])) << c;
    else EXPECT_EQ(f32_bits(got[size_t(c)]), f32_bits(want)) << "code " << c;
  }
}

// Per-channel scales walked in stored order: [rows, 3] with a scale per column,
// and the same values with a scale per row (inner = 3, extent = rows).
TEST(CudaFp8, PerChannelScalesFollowTheStoredStride) {
  KILN_REQUIRE_GPU();
  const int rows = 5, cols = 3;
  const auto x = random_values(size_t(rows * cols), 7, -20.f, 20.f);
  const std::vector<float> col_inv{1.f / 0.01f, 1.f / 0.02f, 1.f / 0.05f}, row_inv{10.f, 20.f, 30.f, 40.f, 50.f};
  const auto dx = upload(x, DType::F32);
  for (bool per_col : {true, false}) {
    const std::vector<float>& inv = per_col ? col_inv : row_inv;
    const auto ds = upload(inv, DType::F32);
    const auto dy = std::make_unique<DevBuf>(x.size());
    quantize_e4m3(dx->ptr(), DType::F32, dy->ptr(), int64_t(x.size()), ds->as<float>(), per_col ? 1 : cols,
                  per_col ? cols : rows, nullptr);
    const auto got = download_bytes(dy->ptr(), x.size());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const size_t i = size_t(r * cols + c);
        EXPECT_EQ(int(got[i]), int(f32_to_e4m3(x[i] * inv[size_t(per_col ? c : r)]))) << r << "," << c;
      }
  }
}

TEST(CudaFp8, PadRowsAppendsZeroColumns) {
  KILN_REQUIRE_GPU();
  const int rows = 7, cols = 5, padded = 16;
  std::vector<uint8_t> x(size_t(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = uint8_t(1 + i);
  const auto dx = upload_bytes(x.data(), x.size());
  const auto dy = std::make_unique<DevBuf>(size_t(rows * padded));
  cudaMemset(dy->ptr(), 0xee, size_t(rows * padded));
  pad_rows_u8(dx->ptr(), rows, cols, dy->ptr(), padded, nullptr);
  const auto got = download_bytes(dy->ptr(), size_t(rows * padded));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < padded; ++c)
      EXPECT_EQ(int(got[size_t(r * padded + c)]), c < cols ? int(x[size_t(r * cols + c)]) : 0) << r << "," << c;
}

// quant_epilogue against LayerEpilogue::apply (the CPU's) on the same f32
// sums, for every output type, with and without a residual, folded and not.
TEST(CudaFp8, EpilogueIsTheCpuEpilogue) {
  KILN_REQUIRE_GPU();
  const int rows = 9, k = 13, ld = 16;
  auto acc = random_values(size_t(rows * ld), 11, -3e5f, 3e5f);
  for (float& a : acc) a = std::round(a);  // FP8 sums are sums of code products: any f32 serves
  const auto residual = random_values(size_t(rows * k), 12, -3.f, 3.f);
  const auto alpha = random_values(size_t(k), 13, 1e-5f, 4e-5f), bias = random_values(size_t(k), 14, -2.f, 2.f);
  const auto d_acc = upload(acc, DType::F32), d_alpha = upload(alpha, DType::F32), d_bias = upload(bias, DType::F32);
  for (DType out : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3})
    for (Activation act : {Activation::None, Activation::Relu})
      for (bool with_res : {false, true}) {
        quant::LayerEpilogue e;
        e.out = out, e.act = act, e.alpha = alpha, e.bias = bias;
        if (out == DType::F8E4M3) {  // as layer_epilogue folds the output scale 1/0.5
          e.inv_out_scale = 1.f / 0.5f, e.folded = true, e.residual_mul = e.inv_out_scale;
          for (size_t c = 0; c < alpha.size(); ++c) e.alpha[c] *= e.inv_out_scale, e.bias[c] *= e.inv_out_scale;
        }
        const auto d_a = upload(e.alpha, DType::F32), d_b = upload(e.bias, DType::F32);
        const DType rdt = out == DType::F8E4M3 ? DType::F16 : out;
        const auto res_stored = round_all(residual, rdt);
        const auto d_res = upload(res_stored, rdt);
        QuantEpilogue q;
        q.alpha = d_a->as<float>(), q.bias = d_b->as<float>(), q.residual_mul = e.residual_mul;
        q.inv_out_scale = e.inv_out_scale, q.scale_after = false, q.act = act;
        const auto dy = alloc(size_t(rows * k), out);
        quant_epilogue(d_acc->as<float>(), ld, q, with_res ? d_res->ptr() : nullptr, rdt, dy->ptr(), out, rows, k, nullptr);
        std::vector<float> got;
        if (out == DType::F8E4M3)
          for (uint8_t code : download_bytes(dy->ptr(), size_t(rows * k))) got.push_back(e4m3_to_f32(code));
        else got = download(dy->ptr(), size_t(rows * k), out);
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < k; ++c) {
            const size_t i = size_t(r * k + c);
            const float want =
                round_to_storage(out, e.apply(c, double(acc[size_t(r * ld + c)]), with_res ? &res_stored[i] : nullptr));
            EXPECT_EQ(f32_bits(got[i]), f32_bits(want)) << dtype_name(out) << " " << activation_name(act) << " residual "
                                                        << with_res << " at " << r << "," << c;
          }
      }
}

// kiln's CUTLASS 8-bit GEMM (fp8_gemm_sm90.hpp), every configuration (e4m3
// and, since session 17, i8 codes; data-parallel and stream-K schedulers),
// against quant::LayerEpilogue::apply over sums that are exact in any order
// (codes of small integers: |sum| <= 16 k), so CUTLASS's result must be the
// CPU's bit for bit: shapes with rows off the tile (1, 77), n of one to four
// tiles, outputs f16 and codes, residual none / f16 / codes, ReLU on and off.
TEST(CudaFp8, Sm90GemmIsTheCpuEpilogueOverExactSums) {
  KILN_REQUIRE_GPU();
  if (fp8_gemm_sm90_configs() == 0) GTEST_SKIP() << "built without CUTLASS's headers (tools/setup.sh)";
  if (const std::string why =
          fp8_gemm_sm90_unsupported(0, DType::F8E4M3, 16, 16, 16, false, DType::F16, DType::F16, Activation::None);
      !why.empty())
    GTEST_SKIP() << why;
  // A code's bits for an integer value v in [-128, 127] (e4m3: exact up to 16), and the code's value.
  const auto encode = [](DType code, float v) {
    return code == DType::I8 ? static_cast<uint8_t>(static_cast<int8_t>(v)) : f32_to_e4m3(v);
  };
  const auto decode = [](DType code, uint8_t b) {
    return code == DType::I8 ? static_cast<float>(static_cast<int8_t>(b)) : e4m3_to_f32(b);
  };
  struct Dims { int m, n, k; };
  for (const Dims d : {Dims{1, 16, 16}, Dims{77, 48, 32}, Dims{300, 256, 64}, Dims{1000, 64, 256}})
    for (DType code : {DType::F8E4M3, DType::I8}) {
    // Codes of integers in [-4, 4]: products <= 16, sums exact in f32 and in int32.
    std::vector<uint8_t> xc(size_t(d.m) * d.k), wc(size_t(d.n) * d.k);
    std::vector<float> xv(xc.size()), wv(wc.size());
    const auto rx = random_values(xc.size(), 21, -4.49f, 4.49f), rw = random_values(wc.size(), 22, -4.49f, 4.49f);
    for (size_t i = 0; i < xc.size(); ++i) xc[i] = encode(code, std::round(rx[i])), xv[i] = decode(code, xc[i]);
    for (size_t i = 0; i < wc.size(); ++i) wc[i] = encode(code, std::round(rw[i])), wv[i] = decode(code, wc[i]);
    std::vector<double> acc(size_t(d.m) * d.n, 0.0);
    for (int r = 0; r < d.m; ++r)
      for (int c = 0; c < d.n; ++c)
        for (int i = 0; i < d.k; ++i) acc[size_t(r) * d.n + c] += double(xv[size_t(r) * d.k + i]) * wv[size_t(c) * d.k + i];
    const auto dx = upload_bytes(xc.data(), xc.size()), dw = upload_bytes(wc.data(), wc.size());
    const auto alpha = random_values(size_t(d.n), 23, 1e-3f, 4e-3f), bias = random_values(size_t(d.n), 24, -0.2f, 0.2f);
    const auto res_f = random_values(size_t(d.m) * d.n, 25, -3.f, 3.f);
    std::vector<uint8_t> res_codes(res_f.size());
    std::vector<float> res_code_values(res_f.size());
    for (size_t i = 0; i < res_f.size(); ++i) {
      const float r = code == DType::I8 ? std::nearbyint(res_f[i] * 40.f) : res_f[i] * 100.f;
      res_codes[i] = code == DType::I8 ? encode(code, r) : f32_to_e4m3(r), res_code_values[i] = decode(code, res_codes[i]);
    }
    const auto res_f16 = round_all(res_f, DType::F16);
    const auto d_res16 = upload(res_f16, DType::F16), d_res8 = upload_bytes(res_codes.data(), res_codes.size());
    for (int cfg = 0; cfg < fp8_gemm_sm90_configs(); ++cfg) {
      if (fp8_gemm_sm90_config_code(cfg) != code) continue;
      for (DType out : {DType::F16, code})
        for (DType rdt : {DType::F32, DType::F16, code})  // F32: no residual
          for (Activation act : {Activation::None, Activation::Relu}) {
            const bool with_res = rdt != DType::F32;
            quant::LayerEpilogue e;
            e.out = out, e.act = act, e.alpha = alpha, e.bias = bias;
            if (rdt == code) e.residual_scale = 0.01f;
            if (out == code) {  // the output scale 1/0.02 folded, as layer_epilogue does
              e.inv_out_scale = 1.f / 0.02f, e.folded = true, e.residual_mul = e.inv_out_scale;
              for (int c = 0; c < d.n; ++c) e.alpha[size_t(c)] *= e.inv_out_scale, e.bias[size_t(c)] *= e.inv_out_scale;
            }
            ASSERT_EQ(fp8_gemm_sm90_unsupported(cfg, code, d.m, d.n, d.k, with_res, rdt, out, act), "");
            const auto d_a = upload(e.alpha, DType::F32), d_b = upload(e.bias, DType::F32);
            QuantEpilogue q;
            q.alpha = d_a->as<float>(), q.bias = d_b->as<float>(), q.residual_mul = e.residual_mul;
            q.residual_scale = e.residual_scale, q.inv_out_scale = e.inv_out_scale, q.act = act;
            const size_t ws_bytes = fp8_gemm_sm90_workspace(cfg, d.m, d.n, d.k);
            const auto ws = alloc(ws_bytes + 1, DType::F32);
            const auto dy = alloc(size_t(d.m) * d.n, out);
            const void* res = rdt == DType::F16 ? d_res16->ptr() : rdt == code ? d_res8->ptr() : nullptr;
            ASSERT_NO_THROW(fp8_gemm_sm90(cfg, code, dx->ptr(), dw->ptr(), q, res, rdt, dy->ptr(), out, d.m, d.n, d.k,
                                          ws->ptr(), ws_bytes, nullptr));
            std::vector<float> got;
            if (out == code)
              for (uint8_t b : download_bytes(dy->ptr(), size_t(d.m) * d.n)) got.push_back(decode(code, b));
            else got = download(dy->ptr(), size_t(d.m) * d.n, out);
            int bad = 0;
            for (int r = 0; r < d.m && bad < 5; ++r)
              for (int c = 0; c < d.n && bad < 5; ++c) {
                const size_t i = size_t(r) * d.n + c;
                const float* rv = rdt == DType::F16 ? &res_f16[i] : rdt == code ? &res_code_values[i] : nullptr;
                const float want = round_to_storage(out, e.apply(c, acc[i], rv));
                if (f32_bits(got[i]) != f32_bits(want)) {
                  ++bad;
                  ADD_FAILURE() << fp8_gemm_sm90_config_name(cfg) << " [" << d.m << "," << d.k << "]x[" << d.n << "," << d.k
                                << "] out " << dtype_name(out) << " residual " << (with_res ? dtype_name(rdt) : "none") << " "
                                << activation_name(act) << " at " << r << "," << c << ": " << got[i] << " want " << want;
                }
              }
          }
    }
  }
}

// A one-conv graph: x [1, 16, 4, 4] of `code`, weight [8, 16 / groups, 3, 3].
Graph quantized_conv(DType code, int64_t groups) {
  Graph g;
  const int x = g.add_input("x", code, {1, 16, 4, 4});
  g.values[x].quant = QuantParams{{0.02f}, -1, code};
  const Shape ws{8, 16 / groups, 3, 3};
  const HostTensor wf = HostTensor::from_f32(ws, random_values(size_t(shape_numel(ws)), 3, -0.5f, 0.5f));
  const QuantParams wq = quant::weight_quant(wf, code);
  const int w = g.add_constant("w", quant::quantize_tensor(wf, wq, quant::Int8Range::Narrow));
  g.values[w].quant = wq;
  g.mark_output(g.add_node(Op::Conv2d, "layer1.0.conv2", {x, w},
                           {{"groups", groups}, {"out_dtype", std::string("f16")}, {"activation", std::string("relu")}}));
  return g;
}

// What `kiln build --backend cuda` and the harness ask first (no GPU needed):
// FP8 and INT8 layers are taken, grouped 8-bit convs refused naming the node.
TEST(CudaFp8, LoweringRefusalNamesTheNode) {
  EXPECT_EQ(lowering_refusal(quantized_conv(DType::F8E4M3, 1)), "");
  EXPECT_EQ(lowering_refusal(quantized_conv(DType::I8, 1)), "");
  for (DType code : {DType::F8E4M3, DType::I8}) {
    const std::string grouped = lowering_refusal(quantized_conv(code, 2));
    EXPECT_EQ(grouped.rfind("layer1.0.conv2: ", 0), 0u) << grouped;
    EXPECT_NE(grouped.find("no CUDA 8-bit path for a grouped conv ([1,16,4,4], groups 2)"), std::string::npos) << grouped;
  }
}

}  // namespace
}  // namespace kiln::cuda::test
