// Helpers shared by the family tests (families/*/tests): build a fixture into
// a bundle and run it, damage copies of fixtures, and check build errors.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bundle/builder.hpp"
#include "checkpoint/safetensors.hpp"
#include "graph_test_util.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/npy.hpp"
#include "families/family.hpp"
#include "kiln/kiln.hpp"
#include "passes/pass.hpp"

namespace kiln::testing {

namespace fs = std::filesystem;

inline fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("kiln_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Case names listed in <root>/manifest.json.
inline std::vector<std::string> fixture_cases(const fs::path& root) {
  std::ifstream f(root / "manifest.json");
  auto j = nlohmann::json::parse(f);
  std::vector<std::string> names;
  for (const auto& c : j["cases"]) names.push_back(c["name"].get<std::string>());
  return names;
}

struct FixtureRun {
  std::vector<float> got, want;
  MemoryReport memory;
};

// Builds <root>/<name> at `precision` on the CPU backend (IR verifier on) and
// runs its input.npy; `want` is the PyTorch logits.npy.
inline FixtureRun build_and_run(const fs::path& root, const std::string& name, DType precision) {
  fs::path dir = temp_dir(name);
  BuildOptions o;
  o.model = (root / name).string();
  o.precision = precision;
  o.verify = true;
  build_bundle(o, dir / "m.bundle");
  auto engine = Engine::load((dir / "m.bundle").string());
  HostTensor x = read_npy(root / name / "input.npy");
  HostTensor want = read_npy(root / name / "logits.npy");
  auto ctx = engine->create_context();
  auto out = ctx->run({{"pixel_values", x.shape, x.to_f32()}});
  EXPECT_EQ(out.at(0).name, "logits");
  EXPECT_EQ(out.at(0).shape, want.shape);
  FixtureRun r{out.at(0).data, want.to_f32(), ctx->memory()};
  fs::remove_all(dir);
  return r;
}

// The graph a family builds for fixture directory `dir`, after the default
// pipeline at `precision` (channel_align > 1: with pad_channels, as CUDA
// builds run it); `family` is the family expected to claim it.
// The ModelSource of model directory `dir` over `ckpt` (opened from dir by
// the caller, which keeps it alive while the source is used).
inline ModelSource model_source(const fs::path& dir, const Checkpoint& ckpt) {
  ModelSource src;
  src.dir = dir;
  src.config_path = dir / "config.json";
  src.config = nlohmann::json::parse(std::ifstream(src.config_path));
  src.checkpoint = &ckpt;
  return src;
}

// `merge_linears` false: the graph the quantize pass sees (before merge_parallel_linears).
inline Graph fixture_graph(const fs::path& dir, DType precision, int64_t channel_align, const std::string& family,
                           bool merge_linears = true) {
  Checkpoint ckpt = Checkpoint::open(dir);
  const ModelSource src = model_source(dir, ckpt);
  const Family& f = family_registry().select(src);
  EXPECT_EQ(f.name(), family) << dir;
  BuildRequest req;
  req.source = &src;
  Graph g = f.build(req).graph;
  PipelineOptions po;
  po.verify = true;
  po.precision = precision;
  po.channel_align = channel_align;
  po.merge_linears = merge_linears;
  run_pipeline(g, po);
  return g;
}

// A copy of a fixture that a test may damage.
inline fs::path copy_fixture(const fs::path& root, const std::string& name, const std::string& tag) {
  fs::path dst = temp_dir(tag);
  fs::copy(root / name, dst, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return dst;
}

// Builds model_dir expecting an input error; checks nothing is left behind
// and returns the message.
inline std::string build_error(const fs::path& model_dir) {
  BuildOptions o;
  o.model = model_dir.string();
  fs::path out = model_dir / "out.bundle";
  try {
    build_bundle(o, out);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    EXPECT_FALSE(fs::exists(out)) << "partial output left behind";
    for (const auto& f : fs::directory_iterator(model_dir))
      EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << "temp file left: " << f.path();
    return e.what();
  }
  ADD_FAILURE() << "build succeeded";
  return "";
}

// Rewrites the JSON header of <dir>/model.safetensors in place (data region unchanged).
inline void edit_header(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto bytes = read_file_bytes(dir / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  edit(header);
  std::string h = header.dump();
  std::vector<uint8_t> out(8);
  uint64_t hn = h.size();
  std::memcpy(out.data(), &hn, 8);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), bytes.begin() + 8 + static_cast<long>(n), bytes.end());
  std::ofstream(dir / "model.safetensors", std::ios::binary).write(reinterpret_cast<const char*>(out.data()), out.size());
}

// Builds the same checkpoint twice: the bundles must be byte-identical.
inline void expect_reproducible(const fs::path& model_dir) {
  fs::path dir = temp_dir("repro");
  BuildOptions o;
  o.model = model_dir.string();
  build_bundle(o, dir / "a.bundle");
  build_bundle(o, dir / "b.bundle");
  EXPECT_EQ(sha256_file_hex(dir / "a.bundle"), sha256_file_hex(dir / "b.bundle")) << model_dir;
  fs::remove_all(dir);
}

// Renames one tensor (or drops it when to == "").
inline void rename_tensor(const fs::path& dir, const std::string& from, const std::string& to) {
  edit_header(dir, [&](nlohmann::json& header) {
    ASSERT_TRUE(header.contains(from)) << from;
    if (!to.empty()) header[to] = header[from];
    header.erase(from);
  });
}

// Builds a copy of fixture <root>/<name> with tensor `from` renamed to `to`
// (dropped when `to` is ""), expecting an input error; returns its message.
inline std::string build_error_after_rename(const fs::path& root, const std::string& name, const std::string& from,
                                            const std::string& to) {
  fs::path d = copy_fixture(root, name, "rename");
  rename_tensor(d, from, to);
  std::string msg = build_error(d);
  fs::remove_all(d);
  return msg;
}

}  // namespace kiln::testing

// The PyTorch comparison every family runs on each of its fixtures (issues #2
// and #4): the fp32 engine within max|diff| <= 1e-4 * max|logit|, the fp16
// engine at cosine >= 0.999, and the memory plan below the naive sum.
#define KILN_FAMILY_FIXTURE_TESTS(Suite, root)                                                      \
  class Suite : public ::testing::TestWithParam<std::string> {};                                    \
  TEST_P(Suite, Fp32MatchesPyTorch) {                                                               \
    ::kiln::testing::FixtureRun r = ::kiln::testing::build_and_run(root, GetParam(), ::kiln::DType::F32); \
    EXPECT_LE(::kiln::testing::max_abs_diff(r.got, r.want), 1e-4f * ::kiln::testing::max_abs(r.want)) \
        << GetParam();                                                                              \
    EXPECT_LT(r.memory.arena_bytes, r.memory.naive_bytes);                                          \
  }                                                                                                 \
  TEST_P(Suite, Fp16WithinCosine) {                                                                 \
    ::kiln::testing::FixtureRun r = ::kiln::testing::build_and_run(root, GetParam(), ::kiln::DType::F16); \
    EXPECT_GE(::kiln::testing::cosine(r.got, r.want), 0.999) << GetParam();                         \
  }                                                                                                 \
  INSTANTIATE_TEST_SUITE_P(Fixtures, Suite, ::testing::ValuesIn(::kiln::testing::fixture_cases(root)), \
                           [](const auto& info) { return info.param; })
