// One CPU engine shared by several threads, each with its own context (the
// contract in kiln.hpp: Engine is immutable and shareable, a context per
// thread). Every run must give the same bits as one thread alone. Also run
// under ThreadSanitizer (tools/test.sh tsan picks tests with "Thread" in
// their name), which is where a race in the engine, the contexts' plans,
// the thread pool or the BLAS thread setting would show.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <cstring>
#include <ostream>
#include <thread>

#include "bundle/builder.hpp"
#include "core/npy.hpp"
#include "family_test_util.hpp"
#include "kiln/kiln.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr int kThreads = 4;
constexpr int kRunsPerThread = 3;

struct Case {
  const char* root;  // under tests/fixtures
  const char* name;
  friend std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.root << "/" << c.name; }
};

class EngineThreads : public ::testing::TestWithParam<Case> {};

// The fixture's first image at batch 1 and at batch 2 (the fixture's own
// batch when it has one), so the threads also plan and run two batch sizes
// side by side.
std::vector<std::vector<Tensor>> inputs_of(const HostTensor& x) {
  const std::vector<float> all = x.to_f32();
  const size_t per_image = all.size() / static_cast<size_t>(x.shape[0]);
  const std::vector<float> one(all.begin(), all.begin() + per_image);
  Shape s1 = x.shape, s2 = x.shape;
  s1[0] = 1;
  std::vector<float> two = all;
  if (x.shape[0] == 1) {
    two.insert(two.end(), one.begin(), one.end());
    s2[0] = 2;
  }
  return {{{"pixel_values", s1, one}}, {{"pixel_values", s2, two}}};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_P(EngineThreads, ContextsOfOneEngineAgreeBitForBit) {
  const fs::path root = fs::path(KILN_FIXTURES_DIR) / GetParam().root;
  const fs::path dir = testing::temp_dir(std::string("threads_") + GetParam().name);
  BuildOptions o;
  o.model = (root / GetParam().name).string();
  build_bundle(o, dir / "m.bundle");
  auto engine = Engine::load((dir / "m.bundle").string());
  const auto inputs = inputs_of(read_npy(root / GetParam().name / "input.npy"));

  // Reference: one context, one thread.
  std::vector<std::vector<float>> want;
  {
    auto ctx = engine->create_context();
    for (const auto& in : inputs) want.push_back(ctx->run(in).at(0).data);
  }
  ASSERT_GT(want[1].size(), want[0].size());

  std::atomic<int> mismatches{0}, runs{0};
  std::mutex diff_mutex;
  float max_diff = 0;  // largest |difference| of a mismatching run, to tell rounding from garbage
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        auto ctx = engine->create_context();
        for (int r = 0; r < kRunsPerThread; ++r)
          for (size_t i = 0; i < inputs.size(); ++i) {
            // Threads start at different batch sizes so that both are in flight at once.
            const size_t k = (i + t) % inputs.size();
            const std::vector<float> got = ctx->run(inputs[k]).at(0).data;
            if (!same_bits(got, want[k])) {
              ++mismatches;
              float d = 0;
              for (size_t j = 0; j < got.size() && j < want[k].size(); ++j) d = std::max(d, std::fabs(got[j] - want[k][j]));
              std::lock_guard<std::mutex> lock(diff_mutex);
              max_diff = std::max(max_diff, d);
            }
            ++runs;
          }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  fs::remove_all(dir);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(runs.load(), kThreads * kRunsPerThread * static_cast<int>(inputs.size()));
  EXPECT_EQ(mismatches.load(), 0) << "max |difference| " << max_diff << " (max |logit| " << testing::max_abs(want[0]) << ")";
}

// A plain ResNet (fused conv+add), a Res2Net (channel views, in-place concat)
// and an EfficientNet (depthwise convs, squeeze-excitation mul).
INSTANTIATE_TEST_SUITE_P(Fixtures, EngineThreads,
                         ::testing::Values(Case{"resnet", "bottleneck"}, Case{"res2net", "s4_26w"},
                                           Case{"efficientnet", "b0_narrow"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kiln
