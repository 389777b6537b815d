// Op harness for kiln's CUDA kernels: every launcher, every engine dtype,
// awkward shapes, checked against the CPU reference kernels (NCHW f32) after
// converting layouts on the host. Error measures are in cuda_test_util.hpp
// (elementwise_tol) unless a case states its own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>

#include "backends/cpu/kernels.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/cublaslt_linear.hpp"
#include "core/error.hpp"
#include "cuda_test_util.hpp"

namespace kiln::cuda::test {
namespace {

const Activation kActs[] = {Activation::None, Activation::Relu, Activation::Relu6, Activation::Silu,
                            Activation::Sigmoid};

std::string tag(DType dt, const std::string& rest) { return std::string(dtype_name(dt)) + " " + rest; }

struct Nchw {
  int n, c, h, w;
  size_t count() const { return size_t(n) * c * h * w; }
  std::string str() const {
    return std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
  }
};
const Nchw kShapes[] = {{1, 3, 7, 7}, {3, 13, 17, 13}, {1, 64, 1, 1}, {3, 130, 7, 7}, {1, 1, 17, 13}, {3, 64, 7, 7}};

// Layout conversion is exact: the only rounding is the RNE cast, which must
// match kiln's host conversion bit for bit (error measure: max abs == 0).
TEST(CudaKernels, NchwNhwcRoundTrip) {
  KILN_REQUIRE_GPU();
  for (DType dt : kFloatTypes)
    for (const Nchw& s : kShapes) {
      const auto x = random_values(s.count(), 1);
      const auto dx = upload(x, DType::F32);
      const auto dy = alloc(s.count(), dt);
      nchw_f32_to_nhwc(dx->as<float>(), dy->ptr(), dt, s.n, s.c, s.h, s.w, nullptr);
      const auto ref = nchw_to_nhwc(round_all(x, dt), s.n, s.c, s.h, s.w);
      expect_close(download(dy->ptr(), s.count(), dt), ref, 0.0, tag(dt, "to_nhwc " + s.str()));
      const auto dz = alloc(s.count(), DType::F32);
      nhwc_to_nchw_f32(dy->ptr(), dt, dz->as<float>(), s.n, s.c, s.h, s.w, nullptr);
      expect_close(download(dz->ptr(), s.count(), DType::F32), round_all(x, dt), 0.0, tag(dt, "to_nchw " + s.str()));
    }
}

// Casts are exact RNE conversions (max abs == 0), aligned and unaligned.
TEST(CudaKernels, Cast) {
  KILN_REQUIRE_GPU();
  for (DType from : kFloatTypes)
    for (DType to : kFloatTypes)
      for (size_t count : {size_t(1), size_t(13), size_t(1000), size_t(4099)})
        for (size_t off : {size_t(0), size_t(1)}) {
          const auto x = round_all(random_values(count, 2, -70000.f, 70000.f), from);
          const auto dx = upload(x, from, off);
          const auto dy = alloc(count, to, off);
          cast(dx->ptr(), from, dy->ptr(), to, int64_t(count), nullptr);
          expect_close(download(dy->ptr(), count, to), round_all(x, to), 0.0,
                       std::string(dtype_name(from)) + "->" + dtype_name(to) + " n=" + std::to_string(count));
        }
}

const size_t kCounts[] = {1, 7, 13 * 17, 3 * 64 * 49 + 5, 1 << 20};

TEST(CudaKernels, AddAndActivation) {
  KILN_REQUIRE_GPU();
  for (DType dt : kFloatTypes)
    for (size_t count : kCounts)
      for (Activation act : kActs)
        for (size_t off : {size_t(0), size_t(1)}) {
          const std::string what = tag(dt, std::string(activation_name(act)) + " n=" + std::to_string(count) +
                                               " off=" + std::to_string(off));
          const auto a = round_all(random_values(count, 3), dt), b = round_all(random_values(count, 4), dt);
          std::vector<float> ref(count);
          cpu::add(int64_t(count), a.data(), b.data(), act, ref.data());
          const auto da = upload(a, dt, off), db = upload(b, dt, off);
          const auto dy = alloc(count, dt, off);
          add(da->ptr(), db->ptr(), dy->ptr(), dt, int64_t(count), act, nullptr);
          expect_close(download(dy->ptr(), count, dt), ref, elementwise_tol(dt), "add " + what);
          add(da->ptr(), db->ptr(), da->ptr(), dt, int64_t(count), act, nullptr);  // in place, y = a
          expect_close(download(da->ptr(), count, dt), ref, elementwise_tol(dt), "add in place " + what);

          cpu::activation(int64_t(count), b.data(), act, ref.data());
          activation(db->ptr(), dy->ptr(), dt, int64_t(count), act, nullptr);
          expect_close(download(dy->ptr(), count, dt), ref, elementwise_tol(dt), "activation " + what);
          activation(db->ptr(), db->ptr(), dt, int64_t(count), act, nullptr);
          expect_close(download(db->ptr(), count, dt), ref, elementwise_tol(dt), "activation in place " + what);
        }
}

// No CPU kernel exists for a folded batch norm (the CPU backend folds it into
// the conv), so the reference is the formula itself.
TEST(CudaKernels, BatchNorm) {
  KILN_REQUIRE_GPU();
  for (DType dt : kFloatTypes)
    for (const Nchw& s : kShapes)
      for (Activation act : kActs) {
        const int64_t rows = int64_t(s.n) * s.h * s.w;
        const auto x = round_all(random_values(s.count(), 5), dt);
        const auto scale = random_values(size_t(s.c), 6, 0.5f, 2.f), shift = random_values(size_t(s.c), 7);
        std::vector<float> ref(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          const size_t ch = i % size_t(s.c);
          ref[i] = apply_activation(act, x[i] * scale[ch] + shift[ch]);
        }
        const auto dx = upload(x, dt), dscale = upload(scale, DType::F32), dshift = upload(shift, DType::F32);
        const auto dy = alloc(x.size(), dt);
        batch_norm_nhwc(dx->ptr(), dy->ptr(), dt, rows, s.c, dscale->as<float>(), dshift->as<float>(), act, nullptr);
        expect_close(download(dy->ptr(), x.size(), dt), ref, elementwise_tol(dt),
                     tag(dt, "batch_norm " + s.str() + " " + activation_name(act)));
      }
}

TEST(CudaKernels, MulChannel) {
  KILN_REQUIRE_GPU();
  for (DType dt : kFloatTypes)
    for (const Nchw& s : kShapes) {
      const int hw = s.h * s.w;
      const auto x = round_all(random_values(s.count(), 8), dt);
      const auto sc = round_all(random_values(size_t(s.n) * s.c, 9, 0.f, 1.f), dt);
      std::vector<float> ref_nchw(x.size());
      cpu::mul_channel(s.n, s.c, hw, nhwc_to_nchw(x, s.n, s.c, s.h, s.w).data(), sc.data(), ref_nchw.data());
      const auto dx = upload(x, dt), ds = upload(sc, dt);
      const auto dy = alloc(x.size(), dt);
      mul_channel_nhwc(dx->ptr(), ds->ptr(), dy->ptr(), dt, s.n, hw, s.c, nullptr);
      expect_close(download(dy->ptr(), x.size(), dt), nchw_to_nhwc(ref_nchw, s.n, s.c, s.h, s.w), elementwise_tol(dt),
                   tag(dt, "mul_channel " + s.str()));
    }
}

struct PoolCase {
  Nchw s;
  int k, stride, pad_t, pad_l, pad_b, pad_r;
  bool ceil;
};
const PoolCase kPools[] = {
    {{1, 64, 7, 7}, 3, 2, 1, 1, 1, 1, false},   {{3, 13, 17, 13}, 3, 2, 1, 1, 1, 1, true},
    {{3, 13, 17, 13}, 3, 2, 1, 1, 1, 1, false}, {{1, 3, 1, 1}, 1, 1, 0, 0, 0, 0, false},
    {{3, 130, 7, 7}, 2, 2, 0, 0, 0, 0, true},   {{1, 1, 17, 13}, 3, 1, 1, 1, 1, 1, false},
    {{1, 8, 7, 7}, 3, 2, 0, 1, 1, 0, true},     {{3, 64, 17, 13}, 3, 2, 1, 1, 1, 1, true},
    {{1, 16, 8, 8}, 3, 3, 1, 1, 1, 1, true},    {{1, 64, 112, 112}, 3, 2, 1, 1, 1, 1, false},
};

TEST(CudaKernels, MaxAndAvgPool) {
  KILN_REQUIRE_GPU();
  for (DType dt : kFloatTypes)
    for (const PoolCase& pc : kPools)
      for (int kind = 0; kind < 3; ++kind) {  // max, avg count_include_pad, avg exclude pad
        const Nchw& s = pc.s;
        cpu::Pool2dParams p;
        p.n = s.n, p.c = s.c, p.h = s.h, p.w = s.w, p.kh = p.kw = pc.k, p.stride_h = p.stride_w = pc.stride;
        p.pad_t = pc.pad_t, p.pad_l = pc.pad_l, p.pad_b = pc.pad_b, p.pad_r = pc.pad_r;
        p.ceil_mode = pc.ceil, p.count_include_pad = kind == 1;
        const int oh = p.out_h(), ow = p.out_w();
        const auto x = round_all(random_values(s.count(), 10), dt);
        std::vector<float> ref(size_t(s.n) * s.c * oh * ow);
        if (kind == 0) cpu::max_pool2d(p, x.data(), ref.data(), cpu::default_pool());
        else cpu::avg_pool2d(p, x.data(), ref.data(), cpu::default_pool());
        const PoolShape ps{s.n,  s.h,      s.w,      s.c,       oh,       ow,       pc.k,     pc.k,
                           pc.stride, pc.stride, pc.pad_t, pc.pad_l, kind == 1, pc.pad_b, pc.pad_r};
        const auto dx = upload(nchw_to_nhwc(x, s.n, s.c, s.h, s.w), dt);
        const auto dy = alloc(ref.size(), dt);
        if (kind == 0) max_pool_nhwc(dx->ptr(), dy->ptr(), dt, ps, nullptr);
        else avg_pool_nhwc(dx->ptr(), dy->ptr(), dt, ps, nullptr);
        expect_close(download(dy->ptr(), ref.size(), dt), nchw_to_nhwc(ref, s.n, s.c, oh, ow), elementwise_tol(dt),
                     tag(dt, std::string(kind == 0 ? "max" : kind == 1 ? "avg incl" : "avg excl") + " " + s.str() +
                                 " k" + std::to_string(pc.k) + " s" + std::to_string(pc.stride) +
                                 (pc.ceil ? " ceil" : "")));
      }
}

TEST(CudaKernels, GlobalAvgPool) {
  KILN_REQUIRE_GPU();
  const Nchw shapes[] = {{1, 3, 1, 1},   {3, 13, 7, 7}, {1, 64, 17, 13}, {3, 130, 7, 7},
                         {2, 2048, 7, 7}, {1, 24, 56, 56}, {3, 1, 17, 13},
                         {1, 13, 56, 56}, {3, 64, 17, 13}, {1, 32, 112, 112}};
  for (DType dt : kFloatTypes)
    for (const Nchw& s : shapes) {
      const auto x = round_all(random_values(s.count(), 11), dt);
      std::vector<float> ref(size_t(s.n) * s.c);
      cpu::global_avg_pool(s.n, s.c, s.h * s.w, x.data(), ref.data());
      const auto dx = upload(nchw_to_nhwc(x, s.n, s.c, s.h, s.w), dt);
      const auto dy = alloc(ref.size(), dt);
      global_avg_pool_nhwc(dx->ptr(), dy->ptr(), dt, s.n, s.h * s.w, s.c, nullptr);
      expect_close(download(dy->ptr(), ref.size(), dt), ref, elementwise_tol(dt), tag(dt, "gap " + s.str()));
    }
}

// Concat of two inputs and a slice, against the CPU's NCHW versions; copies
// are exact (max abs == 0).
TEST(CudaKernels, CopyChannels) {
  KILN_REQUIRE_GPU();
  const int pairs[][2] = {{13, 3}, {64, 64}, {8, 16}, {1, 130}, {24, 40}};
  for (DType dt : kFloatTypes)
    for (const auto& pr : pairs)
      for (int n : {1, 3}) {
        const int c1 = pr[0], c2 = pr[1], c = c1 + c2, h = 7, w = 5, hw = h * w;
        const auto a = random_values(size_t(n) * c1 * hw, 12), b = random_values(size_t(n) * c2 * hw, 13);
        std::vector<float> ref(size_t(n) * c * hw);
        cpu::concat_channels(n, hw, {{a.data(), c1}, {b.data(), c2}}, ref.data());
        const auto da = upload(nchw_to_nhwc(a, n, c1, h, w), dt), db = upload(nchw_to_nhwc(b, n, c2, h, w), dt);
        const auto dy = alloc(ref.size(), dt);
        copy_channels_nhwc(da->ptr(), c1, 0, dy->ptr(), c, 0, c1, int64_t(n) * hw, dt, nullptr);
        copy_channels_nhwc(db->ptr(), c2, 0, dy->ptr(), c, c1, c2, int64_t(n) * hw, dt, nullptr);
        const std::string what = tag(dt, std::to_string(c1) + "+" + std::to_string(c2) + " n=" + std::to_string(n));
        expect_close(download(dy->ptr(), ref.size(), dt), round_all(nchw_to_nhwc(ref, n, c, h, w), dt), 0.0,
                     "concat " + what);
        // The one-launch concat gives the same bytes.
        const auto dz = alloc(ref.size(), dt);
        concat_channels_nhwc({da->ptr(), db->ptr()}, {c1, c2}, dz->ptr(), int64_t(n) * hw, dt, nullptr);
        expect_close(download(dz->ptr(), ref.size(), dt), round_all(nchw_to_nhwc(ref, n, c, h, w), dt), 0.0,
                     "one-launch concat " + what);
        // Whole rows on both sides take the contiguous-copy path.
        const auto df = alloc(ref.size(), dt);
        copy_channels_nhwc(dy->ptr(), c, 0, df->ptr(), c, 0, c, int64_t(n) * hw, dt, nullptr);
        expect_close(download(df->ptr(), ref.size(), dt), round_all(nchw_to_nhwc(ref, n, c, h, w), dt), 0.0,
                     "full copy " + what);
        // One-launch split back into both inputs plus an overlapping window.
        const auto sa = alloc(a.size(), dt), sb = alloc(b.size(), dt), sw = alloc(size_t(n) * 3 * hw, dt);
        const int wb = std::max(0, c1 - 1), wc = std::min(3, c - wb);
        split_channels_nhwc(dy->ptr(), c, {sa->ptr(), sb->ptr(), sw->ptr()}, {0, c1, wb}, {c1, c2, wc}, int64_t(n) * hw, dt,
                            nullptr);
        expect_close(download(sa->ptr(), a.size(), dt), round_all(nchw_to_nhwc(a, n, c1, h, w), dt), 0.0, "split a " + what);
        expect_close(download(sb->ptr(), b.size(), dt), round_all(nchw_to_nhwc(b, n, c2, h, w), dt), 0.0, "split b " + what);
        std::vector<float> wref(size_t(n) * wc * hw);
        cpu::slice_channels(n, c, hw, wb, wc, ref.data(), wref.data());
        expect_close(download(sw->ptr(), wref.size(), dt), round_all(nchw_to_nhwc(wref, n, wc, h, w), dt), 0.0,
                     "split window " + what);
        // Slice [c1/2, c1/2 + c2) of the concatenation back out.
        const int begin = c1 / 2;
        std::vector<float> sref(size_t(n) * c2 * hw);
        cpu::slice_channels(n, c, hw, begin, c2, ref.data(), sref.data());
        const auto ds = alloc(sref.size(), dt);
        copy_channels_nhwc(dy->ptr(), c, begin, ds->ptr(), c2, 0, c2, int64_t(n) * hw, dt, nullptr);
        expect_close(download(ds->ptr(), sref.size(), dt), round_all(nchw_to_nhwc(sref, n, c2, h, w), dt), 0.0,
                     "slice " + what);
      }
}


// Channel windows (CUDA views): add and pools reading and writing windows of
// wider NHWC buffers equal the dense kernels on copies of the windows, bit for
// bit, and leave every channel outside the output window untouched.
TEST(CudaKernels, StridedChannelWindows) {
  KILN_REQUIRE_GPU();
  struct Case {
    int n, h, w, c, wide, off;  // window [off, off + c) of a buffer with `wide` channels per pixel
  };
  const Case cases[] = {{1, 9, 7, 32, 128, 32}, {2, 5, 6, 28, 112, 84}, {1, 7, 7, 13, 40, 3}, {3, 4, 4, 8, 16, 8}};
  for (DType dt : kFloatTypes)
    for (const Case& k : cases) {
      const std::string what = tag(dt, std::to_string(k.c) + "@" + std::to_string(k.off) + "/" + std::to_string(k.wide) +
                                           " n=" + std::to_string(k.n));
      const size_t eb = dtype_size(dt);
      auto window = [&](const std::vector<float>& wide, int64_t rows) {
        std::vector<float> d(size_t(rows) * k.c);
        for (int64_t r = 0; r < rows; ++r)
          for (int ch = 0; ch < k.c; ++ch) d[size_t(r) * k.c + ch] = wide[size_t(r) * k.wide + k.off + ch];
        return d;
      };
      auto outside = [&](const std::vector<float>& wide, int64_t rows) {
        std::vector<float> o;
        for (int64_t r = 0; r < rows; ++r)
          for (int ch = 0; ch < k.wide; ++ch)
            if (ch < k.off || ch >= k.off + k.c) o.push_back(wide[size_t(r) * k.wide + ch]);
        return o;
      };
      auto at = [&](const std::unique_ptr<DevBuf>& b) { return static_cast<void*>(static_cast<char*>(b->ptr()) + k.off * eb); };

      const int64_t rows = int64_t(k.n) * k.h * k.w;
      const auto wa = round_all(random_values(size_t(rows) * k.wide, 31), dt);
      const auto b = round_all(random_values(size_t(rows) * k.c, 32), dt);
      const auto y0 = round_all(random_values(size_t(rows) * k.wide, 33), dt);
      const auto da = upload(wa, dt), db = upload(b, dt), dy = upload(y0, dt);
      const auto dense_a = upload(window(wa, rows), dt), ref = alloc(size_t(rows) * k.c, dt);
      add(dense_a->ptr(), db->ptr(), ref->ptr(), dt, rows * k.c, Activation::Relu, nullptr);
      add_strided_nhwc(at(da), k.wide, db->ptr(), k.c, at(dy), k.wide, rows, k.c, dt, Activation::Relu, nullptr);
      const auto got = download(dy->ptr(), y0.size(), dt);
      expect_close(window(got, rows), download(ref->ptr(), size_t(rows) * k.c, dt), 0.0, "strided add " + what);
      expect_close(outside(got, rows), outside(y0, rows), 0.0, "strided add, other channels " + what);

      // Res2Net's pass-through pool: avg 3x3 stride 2 pad 1, count_include_pad; and a max pool.
      const int oh = (k.h + 2 - 3) / 2 + 1, ow = (k.w + 2 - 3) / 2 + 1;
      const int64_t orows = int64_t(k.n) * oh * ow;
      for (bool is_max : {false, true}) {
        PoolShape ps{k.n, k.h, k.w, k.c, oh, ow, 3, 3, 2, 2, 1, 1, true, 1, 1};
        const auto pref = alloc(size_t(orows) * k.c, dt);
        if (is_max) max_pool_nhwc(dense_a->ptr(), pref->ptr(), dt, ps, nullptr);
        else avg_pool_nhwc(dense_a->ptr(), pref->ptr(), dt, ps, nullptr);
        const auto p0 = round_all(random_values(size_t(orows) * k.wide, 34), dt);
        const auto dp = upload(p0, dt);
        ps.x_stride = k.wide, ps.y_stride = k.wide;
        if (is_max) max_pool_nhwc(at(da), at(dp), dt, ps, nullptr);
        else avg_pool_nhwc(at(da), at(dp), dt, ps, nullptr);
        const auto pgot = download(dp->ptr(), p0.size(), dt);
        const std::string pw = std::string(is_max ? "strided max pool " : "strided avg pool ") + what;
        expect_close(window(pgot, orows), download(pref->ptr(), size_t(orows) * k.c, dt), 0.0, pw);
        expect_close(outside(pgot, orows), outside(p0, orows), 0.0, pw + ", other channels");
      }
    }
}

// Linear through cuBLASLt with every algorithm the heuristic offers run and
// checked. Error measure per output: |got - ref| / (sum_k |x*w| + |b|), the
// scale a dot product's rounding error is proportional to. f32 <= 2e-5 (full
// fp32; TF32 would show ~1e-3), f16 <= 2e-3, bf16 <= 1.6e-2 (the output
// rounding dominates), inputs rounded to the engine type for the reference.
TEST(CudaKernels, LinearEveryTactic) {
  KILN_REQUIRE_GPU();
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const DevBuf ws(LinearOp::kMaxWorkspace);
  int runs = 0, configs = 0, unsupported = 0;
  for (DType dt : kFloatTypes)
    for (int m : {1, 3, 32})
      for (int k : {8, 13, 2048})
        for (int n : {10, 1000})
          for (bool has_bias : {false, true})
            for (Activation act : {Activation::None, Activation::Relu, Activation::Silu}) {
              const std::string what = tag(dt, "m" + std::to_string(m) + " k" + std::to_string(k) + " n" +
                                                   std::to_string(n) + (has_bias ? " bias " : " ") + activation_name(act));
              std::unique_ptr<LinearOp> op;
              try {
                op = std::make_unique<LinearOp>(lt, dt, m, k, n, has_bias, act);
              } catch (const Error& e) {
                // 16-bit rows of 13 elements are 26 bytes: cuBLASLt may refuse them.
                if (dt != DType::F32 && k == 13) {
                  ++unsupported;
                  continue;
                }
                ADD_FAILURE() << what << ": " << e.what();
                continue;
              }
              ++configs;
              const float wr = 1.f / std::sqrt(float(k));
              const auto x = round_all(random_values(size_t(m) * k, 20, -1.f, 1.f), dt);
              const auto w = round_all(random_values(size_t(n) * k, 21, -wr, wr), dt);
              const auto b = round_all(random_values(size_t(n), 22, -1.f, 1.f), dt);
              std::vector<float> ref(size_t(m) * n), scale(ref.size());
              cpu::linear(m, k, n, x.data(), w.data(), has_bias ? b.data() : nullptr, act, ref.data(),
                          cpu::default_pool());
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) {
                  double acc = has_bias ? std::fabs(b[size_t(j)]) : 0.0;
                  for (int q = 0; q < k; ++q) acc += std::fabs(x[size_t(i) * k + q] * w[size_t(j) * k + q]);
                  scale[size_t(i) * n + j] = float(std::max(acc, 1e-6));
                }
              const auto dx = upload(x, dt), dw = upload(w, dt), db = upload(b, dt);
              for (int t = 0; t < op->tactic_count(); ++t) {
                op->select(t);
                const auto dy = alloc(ref.size(), dt);
                op->run(dx->ptr(), dw->ptr(), has_bias ? db->ptr() : nullptr, dy->ptr(), ws.ptr(),
                        LinearOp::kMaxWorkspace, nullptr);
                const double tol = dt == DType::F32 ? 2e-5 : dt == DType::F16 ? 2e-3 : 1.6e-2;
                expect_close(download(dy->ptr(), ref.size(), dt), ref, tol, what + " " + op->tactic_name(t), &scale);
                ++runs;
              }
              if (dt == DType::F16 && m == 32 && k == 2048 && n == 1000 && has_bias && act == Activation::None)
                for (int t = 0; t < op->tactic_count(); ++t) {
                  op->select(t);
                  std::cout << "  f16 32x2048x1000 tactic " << t << ": " << op->tactic_name(t) << " ws "
                            << op->workspace_bytes() << "\n";
                }
            }
  std::cout << "linear: " << configs << " configurations, " << runs << " tactic runs checked, " << unsupported
            << " 16-bit k=13 configurations refused by cuBLASLt\n";
  cublasLtDestroy(lt);
}

// The fused squeeze-excitation MLP against the two-linear CPU reference
// (the hidden vector rounded to the storage type, as the unfused graph
// stores it). Error measure: elementwise_tol(dt) on the sigmoid output.
TEST(CudaKernels, SqueezeExcitationMlp) {
  KILN_REQUIRE_GPU();
  const int shapes[][2] = {{16, 4}, {96, 24}, {1152, 48}, {13, 3}, {1000, 600}};
  for (DType dt : kFloatTypes)
    for (const auto& sh : shapes)
      for (int n : {1, 3, 33})
        for (Activation act1 : {Activation::Silu, Activation::Relu}) {
          const int c = sh[0], cr = sh[1];
          const auto g = round_all(random_values(size_t(n) * c, 21), dt);
          const auto w1 = round_all(random_values(size_t(cr) * c, 22, -0.2f, 0.2f), dt);
          const auto b1 = round_all(random_values(size_t(cr), 23), dt);
          const auto w2 = round_all(random_values(size_t(c) * cr, 24, -0.4f, 0.4f), dt);
          const auto b2 = round_all(random_values(size_t(c), 25), dt);
          std::vector<float> h(size_t(n) * cr), ref(size_t(n) * c);
          cpu::linear(n, c, cr, g.data(), w1.data(), b1.data(), act1, h.data(), cpu::default_pool());
          h = round_all(h, dt);
          cpu::linear(n, cr, c, h.data(), w2.data(), b2.data(), Activation::Sigmoid, ref.data(), cpu::default_pool());
          const auto dg = upload(g, dt), dw1 = upload(w1, dt), db1 = upload(b1, dt), dw2 = upload(w2, dt), db2 = upload(b2, dt);
          const auto ds = alloc(ref.size(), dt);
          const auto ws = alloc(se_mlp_workspace_bytes(n, cr) / 4, DType::F32);
          se_mlp(dg->ptr(), dw1->ptr(), db1->ptr(), dw2->ptr(), db2->ptr(), ds->ptr(), dt, n, c, cr, act1, Activation::Sigmoid,
                 ws->ptr(), se_mlp_workspace_bytes(n, cr), nullptr);
          const std::string what = std::string(dtype_name(dt)) + " se " + std::to_string(c) + "/" + std::to_string(cr) +
                                   " n=" + std::to_string(n);
          expect_close(download(ds->ptr(), ref.size(), dt), round_all(ref, dt), elementwise_tol(dt), what);
          // MLP + gate in one step equals se_mlp then mul_channel_nhwc, bit for bit (also in place).
          for (int hw : {1, 7, 49}) {
            const auto xv = round_all(random_values(size_t(n) * hw * c, 26), dt);
            const auto dx = upload(xv, dt), dref = alloc(xv.size(), dt), dgot = alloc(xv.size(), dt);
            mul_channel_nhwc(dx->ptr(), ds->ptr(), dref->ptr(), dt, n, hw, c, nullptr);
            se_mlp_scale(dg->ptr(), dw1->ptr(), db1->ptr(), dw2->ptr(), db2->ptr(), dx->ptr(), dgot->ptr(), dt, n, hw, c, cr,
                         act1, Activation::Sigmoid, ws->ptr(), se_mlp_workspace_bytes(n, cr), nullptr);
            const auto want = download(dref->ptr(), xv.size(), dt);
            expect_close(download(dgot->ptr(), xv.size(), dt), want, 0.0, what + " scale hw=" + std::to_string(hw));
            se_mlp_scale(dg->ptr(), dw1->ptr(), db1->ptr(), dw2->ptr(), db2->ptr(), dx->ptr(), dx->ptr(), dt, n, hw, c, cr,
                         act1, Activation::Sigmoid, ws->ptr(), se_mlp_workspace_bytes(n, cr), nullptr);
            expect_close(download(dx->ptr(), xv.size(), dt), want, 0.0, what + " scale in place hw=" + std::to_string(hw));
          }
        }
}

// top_k's cluster form (rows of 4096..196608) against its one-block kernel:
// the same values and indices bit for bit, on spread values, mostly ties
// (few distinct values, so the select runs through the index bits), NaN
// and -0, smallest, strided rows (inner > 1), several rows, k = 2048 and
// extents at both ends of the range and not a multiple of the cluster.
// The op harness' top_k cases check both against the CPU reference.
TEST(CudaKernels, TopKClusterFormMatchesOneBlock) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t outer, extent, inner;
    int k;
    bool largest;
    float lo, hi;
    bool specials;
  };
  const Case cases[] = {
      {1, 8400, 1, 300, true, -9.f, 1.f, false},     // RT-DETR's query selection
      {1, 8400, 1, 300, true, -2.51f, -2.49f, false},  // near-flat logits
      {3, 8400, 1, 300, false, 1.f, 1.06f, false},   // mostly ties in 16 bits
      {2, 4099, 3, 2048, true, -1.f, 1.f, true},     // inner stride, k at the limit, NaN and -0
      {1, 4096, 1, 1, true, -1.f, 1.f, false},       // k = 1 takes top_1_kernel whatever the path
      {1, 4096, 1, 7, false, -1.f, 1.f, true},
      {1, 196608, 1, 300, true, -1.f, 1.f, false},   // the longest row of the cluster form
  };
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      const size_t count = size_t(c.outer * c.extent * c.inner);
      std::vector<float> host = random_values(count, uint32_t(c.extent + c.k), c.lo, c.hi);
      if (c.specials)
        for (size_t i = 0; i < count; i += 97) host[i] = (i / 97) % 3 == 0 ? std::nanf("") : (i / 97) % 3 == 1 ? -0.f : 0.f;
      const auto x = upload(host, dt);
      const size_t outs = size_t(c.outer * c.k * c.inner);
      std::vector<std::vector<uint8_t>> got_v, got_i;
      for (TopKPath path : {TopKPath::Auto, TopKPath::OneBlock}) {
        const auto v = alloc(outs, dt);
        DevBuf idx(outs * 8);
        top_k_rows(x->ptr(), v->ptr(), idx.as<int64_t>(), dt, c.outer, c.extent, c.inner, c.k, c.largest, nullptr, path);
        got_v.push_back(download_bytes(v->ptr(), outs * dtype_size(dt)));
        got_i.push_back(download_bytes(idx.ptr(), outs * 8));
      }
      const std::string what = tag(dt, std::to_string(c.outer) + "x" + std::to_string(c.extent) + "x" +
                                           std::to_string(c.inner) + " k " + std::to_string(c.k) +
                                           (c.largest ? " largest" : " smallest"));
      EXPECT_EQ(got_i[0], got_i[1]) << what;
      EXPECT_EQ(got_v[0], got_v[1]) << what;
      // And the indices are in range (the op harness checks the selection itself).
      std::vector<int64_t> idx(outs);
      std::memcpy(idx.data(), got_i[0].data(), outs * 8);
      for (int64_t i : idx) EXPECT_TRUE(i >= 0 && i < c.extent) << what << ": index " << i;
    }
}

// attention's wide form (switch wide_attention): at key split 4, blocks of 2
// or 4 query groups give the bits of blocks of 1, since each warp computes the
// same rows, keys and merge either way; only the number of k/v copies
// changes. Shapes: the decoder's 300 and AIFI's 400 tokens with q and k as
// windows of one projection row, batch 2, query and key counts off the
// tiles, a wide head (the merge's shared memory at 16 warps), dv unlike d.
TEST(CudaKernels, AttentionWideFormsGiveTheSameBits) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t n;
    int lq, lk, heads, d, dv;
    bool windows;
  };
  const Case cases[] = {{1, 300, 300, 8, 32, 32, true}, {1, 400, 400, 8, 32, 32, true}, {2, 300, 300, 8, 32, 32, false},
                        {1, 37, 70, 2, 64, 64, false},  {1, 70, 333, 1, 128, 128, false}, {1, 21, 50, 3, 32, 64, false}};
  for (DType dt : {DType::F16, DType::BF16})
    for (const Case& c : cases) {
      AttentionShape s;
      s.n = c.n, s.lq = c.lq, s.lk = c.lk, s.heads = c.heads, s.d = c.d, s.dv = c.dv;
      s.scale = 1.f / std::sqrt(float(c.d));
      const int64_t qk_w = int64_t(c.heads) * c.d, v_w = int64_t(c.heads) * c.dv;
      if (c.windows) s.q_ld = s.k_ld = 2 * qk_w;  // [q | k] rows, as plan_row_windows reads them
      const size_t q_rows = size_t(c.n) * c.lq, k_rows = size_t(c.n) * c.lk;
      const auto q = upload(random_values(q_rows * (c.windows ? 2 * qk_w : qk_w), uint32_t(c.lq), -1.f, 1.f), dt);
      const auto k = c.windows ? nullptr : upload(random_values(k_rows * qk_w, uint32_t(c.lk + 1), -1.f, 1.f), dt);
      const auto v = upload(random_values(k_rows * v_w, uint32_t(c.lk + 2), -1.f, 1.f), dt);
      const void* kp = c.windows ? static_cast<const char*>(q->ptr()) + qk_w * dtype_size(dt) : k->ptr();
      const size_t bytes = q_rows * v_w * dtype_size(dt);
      std::vector<std::vector<uint8_t>> got;
      for (int groups : {1, 2, 4}) {
        AttentionShape a = s;
        a.split = 4, a.groups = groups;
        const auto y = alloc(q_rows * v_w, dt);  // NaN everywhere until written
        attention(q->ptr(), kp, v->ptr(), y->ptr(), dt, a, nullptr);
        got.push_back(download_bytes(y->ptr(), bytes));
      }
      const std::string what = tag(dt, std::to_string(c.n) + "x" + std::to_string(c.lq) + "x" + std::to_string(c.lk) + " h" +
                                           std::to_string(c.heads) + " d" + std::to_string(c.d) + "/" + std::to_string(c.dv));
      EXPECT_EQ(got[1], got[0]) << what << ": 2 query groups";
      EXPECT_EQ(got[2], got[0]) << what << ": 4 query groups";
      // Every output written and finite (the op harness checks the values).
      const size_t count = q_rows * v_w;
      for (size_t i = 0; i < count; i += 7) {
        uint16_t h;
        std::memcpy(&h, got[0].data() + 2 * i, 2);
        const bool nan_or_inf = dt == DType::F16 ? (h & 0x7c00u) == 0x7c00u : (h & 0x7f80u) == 0x7f80u;
        ASSERT_FALSE(nan_or_inf) << what << ": element " << i;
      }
    }
}

// ms_deform_attn's warp form (switch warp_deform): the block form's bits, since
// each channel's sum runs over the same corners in the same order. Shapes:
// RT-DETR r18vd's decoder (3 levels 80/40/20, 300 queries, 8 heads of 32, 4
// points a level, value a window of the merged value projection's 768-wide
// rows), the discrete method, batch 2 with a query count off the warps, small
// odd levels; shapes and pointers the warp form cannot take fall back to the
// block form (still the same bits).
TEST(CudaKernels, DeformWarpFormGivesTheSameBits) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t n, q;
    std::vector<std::pair<int64_t, int64_t>> levels;
    int heads, d, points;
    int64_t value_ld;  // 0: packed
    bool discrete;
    size_t value_offset;  // elements: 2 makes the value pointer unaligned (block form)
  };
  const Case cases[] = {{1, 300, {{80, 80}, {40, 40}, {20, 20}}, 8, 32, 4, 768, false, 0},
                        {1, 300, {{80, 80}, {40, 40}, {20, 20}}, 8, 32, 4, 768, true, 0},
                        {2, 37, {{5, 7}, {3, 2}}, 3, 8, 3, 0, false, 0},
                        {1, 9, {{6, 6}}, 2, 16, 5, 40, false, 0},
                        {1, 9, {{6, 6}}, 2, 4, 2, 0, false, 0},   // d 4: block form for 16-bit types
                        {1, 11, {{4, 9}, {2, 5}}, 2, 16, 2, 0, false, 2}};
  for (DType dt : {DType::F16, DType::BF16, DType::F32})
    for (const Case& c : cases) {
      DeformAttnShape s;
      s.n = c.n, s.q = c.q, s.heads = c.heads, s.d = c.d, s.levels = int(c.levels.size());
      s.p = c.points * s.levels;
      s.discrete = c.discrete;
      s.value_ld = c.value_ld;
      int64_t start = 0;
      for (size_t l = 0; l < c.levels.size(); ++l) {
        s.level_h[l] = c.levels[l].first, s.level_w[l] = c.levels[l].second, s.level_start[l] = start;
        s.points[l] = c.points;
        start += c.levels[l].first * c.levels[l].second;
      }
      s.s = start;
      const int64_t ld = c.value_ld ? c.value_ld : int64_t(c.heads) * c.d, hd = int64_t(c.heads) * c.d;
      const size_t nq = size_t(c.n * c.q);
      const auto value = upload(random_values(size_t(c.n * s.s * ld) + c.value_offset, 11, -1.f, 1.f), dt);
      const auto ref = upload(random_values(nq * 4, 12, 0.05f, 0.95f), dt);
      const auto off = upload(random_values(nq * size_t(c.heads * s.p * 2), 13, -3.f, 3.f), dt);  // some corners outside
      const auto logits = upload(random_values(nq * size_t(c.heads * s.p), 14, -4.f, 4.f), dt);
      const void* vp = static_cast<const char*>(value->ptr()) + c.value_offset * dtype_size(dt);
      const size_t bytes = nq * size_t(hd) * dtype_size(dt);
      std::vector<std::vector<uint8_t>> got;
      for (DeformPath path : {DeformPath::Block, DeformPath::Warp}) {
        const auto y = alloc(nq * size_t(hd), dt);  // NaN everywhere until written
        ms_deform_attn(vp, ref->ptr(), off->ptr(), logits->ptr(), y->ptr(), dt, s, nullptr, path);
        got.push_back(download_bytes(y->ptr(), bytes));
      }
      const std::string what = tag(dt, std::to_string(c.n) + "x" + std::to_string(c.q) + " levels " +
                                           std::to_string(c.levels.size()) + " h" + std::to_string(c.heads) + " d" +
                                           std::to_string(c.d) + " p" + std::to_string(c.points) +
                                           (c.discrete ? " discrete" : "") + (c.value_offset ? " unaligned" : ""));
      EXPECT_EQ(got[1], got[0]) << what;
      if (c.d == 32 && dt != DType::F32) EXPECT_TRUE(ms_deform_warp_ok(s, dt)) << what << ": r18vd's shape takes the warp form";
      if (c.d == 4 && dt != DType::F32) EXPECT_FALSE(ms_deform_warp_ok(s, dt)) << what;
      // Every output written (the block form writes every element; a NaN left
      // by the poisoned buffer would show in both only if neither wrote it).
      const std::vector<float> y = decode(got[0], dt);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(std::isfinite(y[i])) << what << ": element " << i;
    }
}

// The wide form's rule and the block forms it is built for (no GPU needed).
TEST(CudaKernels, AttentionWideGroupsRule) {
  // RT-DETR r18vd at batch 1 on 132 SMs: 4 groups would leave 40 (56) blocks, under half the SMs; 2 give 80 (104).
  EXPECT_EQ(attention_wide_groups(300, 8, 1, 132), 2);
  EXPECT_EQ(attention_wide_groups(400, 8, 1, 132), 2);
  EXPECT_EQ(attention_wide_groups(300, 8, 8, 132), 4);
  EXPECT_EQ(attention_wide_groups(20, 1, 1, 132), 1);
  EXPECT_EQ(attention_wide_groups(300, 8, 1, 80), 4);
  for (int split : {1, 2, 4})
    for (int groups : {1, 2, 4, 8})
      EXPECT_EQ(attention_mma_form_ok(split, groups), split * groups == 4 || (split == 4 && groups <= 4))
          << split << " x " << groups;
}

}  // namespace
}  // namespace kiln::cuda::test
