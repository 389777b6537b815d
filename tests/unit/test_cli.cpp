// The kiln command line, end to end: exit codes (0 ok, 1 usage, 2 input,
// 3 runtime), JSON outputs, and no partial files on failure.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "bundle/bundle.hpp"
#include "core/file.hpp"
#include "tools/kiln/bench_json.hpp"
#include "cli_test_util.hpp"
#include "core/npy.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kRepo = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path();
const fs::path kDigits = kRepo / "models" / "digits_resnet";

struct Result {
  int code;
  std::string out;
};

Result kiln(const std::string& args, const std::string& env = "") {
  const testing::CliRun r = testing::run_kiln(args, env);
  return {r.code, r.all()};
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("kiln_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Result r = kiln("build " + kDigits.string() + " -o " + (dir_ / "digits.bundle").string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path bundle() { return dir_ / "digits.bundle"; }
  static fs::path dir_;
};
fs::path Cli::dir_;

TEST_F(Cli, VersionAndUsage) {
  EXPECT_EQ(kiln("version").code, 0);
  EXPECT_EQ(kiln("").code, 1);
  EXPECT_EQ(kiln("frobnicate").code, 1);
  EXPECT_EQ(kiln("build").code, 1);
  EXPECT_EQ(kiln("build x -o y --precision fp64").code, 1);
}

TEST_F(Cli, ClassifyJson) {
  Result r = kiln("classify " + bundle().string() + " --json --top-k 3 --image " + (kDigits / "samples" / "digit7_0094.png").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["top_k"].size(), 3u);
  EXPECT_EQ(j[0]["top_k"][0]["label"], "7");
}

TEST_F(Cli, EvalJsonHasTop1) {
  Result r = kiln("eval " + bundle().string() + " --json --dataset " + (kDigits / "heldout").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  auto ref = nlohmann::json::parse(std::ifstream(kDigits / "reference.json"));
  EXPECT_NEAR(j["top1"].get<double>(), ref["pytorch_top1"].get<double>(), 0.005);  // issue #2: within 0.5 points
}

TEST_F(Cli, RunWritesNpyMatchingTheApi) {
  HostTensor x = HostTensor::from_f32({2, 3, 32, 32}, std::vector<float>(2 * 3 * 32 * 32, 0.25f));
  write_npy(dir_ / "x.npy", x);
  fs::path out = dir_ / "run_out";
  Result r = kiln("run " + bundle().string() + " --input pixel_values=" + (dir_ / "x.npy").string() + " --output-dir " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  HostTensor y = read_npy(out / "logits.npy");
  EXPECT_EQ(y.shape, (Shape{2, 10}));
  auto v = y.to_f32();
  for (int k = 0; k < 10; ++k) EXPECT_EQ(v[k], v[10 + k]);  // identical images, identical logits

  write_npy(dir_ / "bad.npy", HostTensor::from_f32({1, 3, 31, 32}, std::vector<float>(3 * 31 * 32)));
  fs::path out2 = dir_ / "run_bad";
  r = kiln("run " + bundle().string() + " --input pixel_values=" + (dir_ / "bad.npy").string() + " --output-dir " + out2.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("pixel_values"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out2 / "logits.npy"));
}

TEST_F(Cli, NotAnImageIsAnInputError) {
  std::ofstream(dir_ / "fake.png") << "this is not an image";
  Result r = kiln("classify " + bundle().string() + " --image " + (dir_ / "fake.png").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("fake.png"), std::string::npos) << r.out;
}

TEST_F(Cli, CorruptBundlesAreRejected) {
  auto bytes = read_file_bytes(bundle());
  // One flipped byte in every section (and in the header) is detected.
  for (size_t pos : {size_t{20}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 7}) {
    auto copy = bytes;
    copy[pos] ^= 0x10;
    fs::path p = dir_ / "flipped.bundle";
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(copy.data()), copy.size());
    Result r = kiln("inspect " + p.string());
    EXPECT_EQ(r.code, 2) << "flip at " << pos << ": " << r.out;
  }
  // A bundle of a newer format names the version problem.
  std::string text(bytes.begin(), bytes.end());
  auto at = text.find("\"format\":1");
  ASSERT_NE(at, std::string::npos);
  text[at + 9] = '7';
  fs::path p = dir_ / "newer.bundle";
  std::ofstream(p, std::ios::binary) << text;
  Result r = kiln("inspect " + p.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("newer"), std::string::npos) << r.out;
}

TEST_F(Cli, FailedBuildLeavesNothing) {
  fs::path model = dir_ / "truncated_model";
  fs::create_directories(model);
  fs::copy_file(kDigits / "config.json", model / "config.json");
  auto st = read_file_bytes(kDigits / "model.safetensors");
  std::ofstream(model / "model.safetensors", std::ios::binary).write(reinterpret_cast<const char*>(st.data()), st.size() / 2);
  fs::path out = dir_ / "never.bundle";
  Result r = kiln("build " + model.string() + " -o " + out.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_EQ(kiln("build " + (dir_ / "no_such_dir").string() + " -o " + out.string()).code, 2);
}

TEST_F(Cli, CudaBundleWithoutGpuFailsClearlyOrFallsBackOnRequest) {
  if (fs::exists("/dev/nvidia0")) GTEST_SKIP() << "a GPU is present: tests/gpu covers CUDA bundles";
  // The same graph labelled as a CUDA bundle (as `kiln build --backend cuda` would on a GPU machine).
  Bundle b = Bundle::open(bundle());
  BundleInfo info = b.info();
  info.backend = "cuda";
  BundleWriter w(info);
  for (const auto& s : b.section_names()) {
    Blob blob = b.section(s);
    w.add_section(s, std::vector<uint8_t>(blob.data, blob.data + blob.size));
  }
  fs::path cuda_bundle = dir_ / "cuda.bundle";
  w.write(cuda_bundle);
  const std::string img = (kDigits / "samples" / "digit7_0094.png").string();
  Result r = kiln("classify " + cuda_bundle.string() + " --image " + img);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("--backend cpu"), std::string::npos) << r.out;
  r = kiln("classify " + cuda_bundle.string() + " --backend cpu --json --image " + img);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out.substr(r.out.find('[')))[0]["top_k"][0]["label"], "7");
}

TEST_F(Cli, BenchJsonWithProfile) {
  Result r = kiln("bench " + bundle().string() + " --iterations 10 --warmup 1 --profile 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  const auto& res = j["results"][0];
  EXPECT_GT(res["engine_ms"]["median"].get<double>(), 0.0);
  EXPECT_LE(res["engine_ms"]["p10"].get<double>(), res["engine_ms"]["p90"].get<double>());
  EXPECT_EQ(res["kernels_per_call"].get<size_t>(), res["profile"]["layers"].size());
  std::set<std::string> groups;
  for (const auto& g : res["profile"]["groups"]) groups.insert(g["group"].get<std::string>());
  for (const char* g : {"conv1", "layer1", "layer4", "fc"}) EXPECT_TRUE(groups.count(g)) << g;
  EXPECT_FALSE(res["task_ms"].is_null());
}

// --trace on the CPU backend: no GPU launches to trace, said in the JSON and
// the text; the timing itself is unaffected.
TEST_F(Cli, BenchTraceOnTheCpuSaysWhyThereIsNone) {
  Result r = kiln("bench " + bundle().string() + " --iterations 10 --warmup 1 --trace 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  const auto& trace = j["results"][0]["trace"];
  EXPECT_EQ(trace["replays"], 3);
  EXPECT_NE(trace["unavailable"].get<std::string>().find("no GPU kernels"), std::string::npos) << trace.dump();
  EXPECT_GT(j["results"][0]["engine_ms"]["median"].get<double>(), 0.0);
  r = kiln("bench " + bundle().string() + " --iterations 10 --warmup 1 --trace 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("trace unavailable: this backend launches no GPU kernels"), std::string::npos) << r.out;
  EXPECT_NE(kiln("bench " + bundle().string() + " --trace 5000").code, 0);  // out of range
}

TEST_F(Cli, BenchJsonBreaksDownLoadAndFirstCall) {
  Result r = kiln("bench " + bundle().string() + " --iterations 10 --warmup 1 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto res = nlohmann::json::parse(r.out.substr(r.out.find('{')))["results"][0];
  const auto& load = res["load_breakdown_ms"];
  ASSERT_TRUE(load.is_object()) << res.dump();
  for (const char* k : {"bundle_read_ms", "backend_compile_ms", "create_context_ms"}) {
    ASSERT_TRUE(load.contains(k)) << k << " in " << load.dump();
    EXPECT_GE(load[k].get<double>(), 0.0) << k;
  }
  // The phases are parts of load_ms: together no more than it.
  EXPECT_LE(load["bundle_read_ms"].get<double>() + load["backend_compile_ms"].get<double>() +
                load["create_context_ms"].get<double>(),
            res["load_ms"].get<double>() + 1e-6);
  // The CPU backend keeps no first-call phases: an empty object, not missing.
  ASSERT_TRUE(res["first_call_breakdown_ms"].is_object()) << res.dump();
  EXPECT_TRUE(res["first_call_breakdown_ms"].empty());
}

TEST(BenchJson, BreakdownKeepsPhasesAndRejectsDuplicates) {
  const auto j = cli::breakdown_json({{"a_ms", 1.5}, {"a_count", 3}}, 2.0);
  EXPECT_EQ(j.size(), 3u);
  EXPECT_DOUBLE_EQ(j["a_ms"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["a_count"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["create_context_ms"].get<double>(), 2.0);
  EXPECT_FALSE(cli::breakdown_json({{"a_ms", 1}}, -1).contains("create_context_ms"));
  EXPECT_THROW(cli::breakdown_json({{"a_ms", 1}, {"a_ms", 2}}, -1), std::logic_error);
}

TEST_F(Cli, BuildsFromTheHuggingFaceCacheAndRecordsProvenance) {
  // A local HF cache: hub/models--kiln--digits/{refs/main, snapshots/<sha>/...}.
  const std::string sha = "0123456789abcdef0123456789abcdef01234567";
  fs::path home = dir_ / "hf_home";
  fs::path snap = home / "hub" / "models--kiln--digits" / "snapshots" / sha;
  fs::create_directories(snap);
  fs::create_directories(home / "hub" / "models--kiln--digits" / "refs");
  std::ofstream(home / "hub" / "models--kiln--digits" / "refs" / "main") << sha;
  fs::copy_file(kDigits / "config.json", snap / "config.json");
  fs::copy_file(kDigits / "model.safetensors", snap / "model.safetensors");
  fs::path out = dir_ / "from_cache.bundle";
  Result r = kiln("build kiln/digits -o " + out.string() + " --json", "HF_HOME=" + home.string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = kiln("inspect --json " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto prov = nlohmann::json::parse(r.out)["provenance"];
  EXPECT_EQ(prov["checkpoint"]["source"], "kiln/digits");
  EXPECT_EQ(prov["checkpoint"]["revision"], sha);
  EXPECT_EQ(prov["checkpoint"]["files"]["model.safetensors"], sha256_file_hex(kDigits / "model.safetensors"));
  // An id that is not in the cache names what was searched.
  r = kiln("build kiln/absent -o " + (dir_ / "absent.bundle").string(), "HF_HOME=" + home.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("kiln/absent"), std::string::npos) << r.out;
}

// `kiln inspect --scales` lists every scale the engine reads: each 8-bit
// weight's per-channel scales (one per output channel) and each 8-bit
// activation's, from graph.json (the only copy of the weight scales).
TEST_F(Cli, InspectScalesListsEveryQuantizedValue) {
  const fs::path out = dir_ / "digits_fp8.bundle";
  Result r = kiln("build " + kDigits.string() + " -o " + out.string() + " --precision fp16 --quantize fp8 --calib " +
                  (kDigits / "samples").string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = kiln("inspect --scales " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const auto info = nlohmann::json::parse(kiln("inspect --json " + out.string()).out);
  const auto& quantized = info["provenance"]["quantization"]["quantized"];
  ASSERT_FALSE(quantized.empty());
  size_t per_channel = 0;
  for (const auto& [name, w] : j["weights"].items()) {
    EXPECT_EQ(w["dtype"], "f8e4m3") << name;
    EXPECT_EQ(w["axis"], 0) << name;
    for (const auto& s : w["scales"]) EXPECT_GT(s.get<double>(), 0.0) << name;
    per_channel += w["scales"].size();
  }
  EXPECT_EQ(j["weights"].size(), quantized.size());  // one weight per quantized conv/linear
  EXPECT_GT(per_channel, j["weights"].size());
  EXPECT_FALSE(j["activations"].empty());
  for (const auto& [name, a] : j["activations"].items()) EXPECT_EQ(a["scales"].size(), 1u) << name;  // per tensor
  // A bundle without 8-bit values lists none.
  r = kiln("inspect --scales " + bundle().string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["weights"].empty());
}

TEST_F(Cli, InspectJson) {
  Result r = kiln("inspect --json " + bundle().string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["header"]["family"], "timm_resnet");
  EXPECT_LT(j["memory"]["arena_bytes"].get<size_t>(), j["memory"]["naive_bytes"].get<size_t>());
  EXPECT_EQ(j["op_counts"].value("batch_norm", 0), 0);  // folded
}

// The CUDA plan recorded in a bundle is shown without a GPU (`kiln inspect
// --plan`, and "plans" in --json). The tactics section here is written by
// hand in the form the CUDA backend records (tests/gpu checks the real one).
TEST_F(Cli, InspectShowsTheRecordedCudaPlanWithoutAGpu) {
  Bundle b = Bundle::open(bundle());
  BundleWriter w(b.info());
  for (const auto& s : b.section_names()) {
    Blob blob = b.section(s);
    w.add_section(s, std::vector<uint8_t>(blob.data, blob.data + blob.size));
  }
  const nlohmann::json plan = {{"window_conv", false}, {"channel_views", false}, {"arena_bytes", 4096},
                               {"workspace_bytes", 256},
                               {"steps", nlohmann::json::array({nlohmann::json::array({"pixel_values.to_nhwc", "nchw_f32_to_nhwc"}),
                                                                  nlohmann::json::array({"conv1", "cudnn eng0_k1=2"})})},
                               {"values", {{"pixel_values", {0, 0}}}}};
  nlohmann::json tactics = {{"key", {{"gpu", "Test GPU"}, {"driver", 1}, {"cudnn", 1}, {"cublaslt", 1}}},
                                  {"layers", {{"conv1", {{"tactic", "eng0_k1=2"}}}}},
                                  {"batches", {{"4", {{"layers", {{"conv1", {{"tactic", "eng0_k1=2"}}}}}, {"plan", plan}}}}}};
  // Batch 8 runs two view blocks as window convs (the per-block form of window_conv).
  nlohmann::json plan8 = plan;
  plan8["window_conv"] = {"layer1.0", "layer2.0"};
  plan8["channel_views"] = true;
  plan8["side_lane"] = {{{"steps", {1}}, {"fork", 0}, {"join", 2}}};  // conv1 on the second stream
  tactics["batches"]["8"] = {{"layers", {{"layer1.0", {{"tactic", "window convs"}, {"time_us", 3.5}}}}}, {"plan", plan8}};
  w.add_section("tactics.test_gpu.json", tactics.dump());
  const fs::path with_plan = dir_ / "with_plan.bundle";
  w.write(with_plan);
  Result r = kiln("inspect --plan " + with_plan.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("CUDA plan for batch 4 (Test GPU for batch 4, 8 (first shown)): 2 steps, arena 4096 bytes"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("cudnn eng0_k1=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes, window convs off, channel views off"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("window convs in 2 blocks (layer1.0, layer2.0), channel views on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("side lane: 1 runs on a second stream"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cudnn eng0_k1=2  [side lane 0: forked before step 0, joined before step 2]"), std::string::npos) << r.out;
  r = kiln("inspect --json " + with_plan.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["plans"]["4"], plan);
  EXPECT_EQ(nlohmann::json::parse(r.out)["plans"]["8"], plan8);
  r = kiln("inspect --plan " + bundle().string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no CUDA plan recorded"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln
