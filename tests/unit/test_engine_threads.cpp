// One CPU engine shared by several threads, each with its own context (the
// contract in kiln.hpp: Engine is immutable and shareable, a context per
// thread). Every run must give the same bits as one thread alone. Also run
// under ThreadSanitizer (tools/test.sh tsan picks tests with "Thread" in
// their name), which is where a race in the engine, the contexts' plans,
// the thread pool or the BLAS thread setting would show.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
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
};

class EngineThreads : public ::testing::TestWithParam<Case> {};

// The fixture input at batch 1 and the same image twice at batch 2, so the
// threads also plan and run two batch sizes side by side.
std::vector<std::vector<Tensor>> inputs_of(const HostTensor& x) {
  std::vector<float> one = x.to_f32();
  std::vector<float> two = one;
  two.insert(two.end(), one.begin(), one.end());
  Shape s2 = x.shape;
  s2[0] = 2;
  return {{{"pixel_values", x.shape, one}}, {{"pixel_values", s2, two}}};
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
  // The batch-2 run holds the image twice; both halves must match batch 1.
  ASSERT_EQ(want[1].size(), 2 * want[0].size());
  EXPECT_TRUE(same_bits(std::vector<float>(want[1].begin(), want[1].begin() + want[0].size()), want[0]));

  std::atomic<int> mismatches{0}, runs{0};
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
            if (!same_bits(ctx->run(inputs[k]).at(0).data, want[k])) ++mismatches;
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
  EXPECT_EQ(mismatches.load(), 0);
}

// A plain ResNet (fused conv+add), a Res2Net (channel views, in-place concat)
// and an EfficientNet (depthwise convs, squeeze-excitation mul).
INSTANTIATE_TEST_SUITE_P(Fixtures, EngineThreads,
                         ::testing::Values(Case{"resnet", "bottleneck"}, Case{"res2net", "s4_26w"},
                                           Case{"efficientnet", "b0_narrow"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kiln
