// kiln study quant (issue 13 part 5) end to end on the CPU backend: the
// variants are built, timed and compared with the fp32 engine, and the report
// and study.json hold the numbers of this run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_test_util.hpp"
#include "tools/kiln/profile_json.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(KILN_FIXTURES_DIR);

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(CliStudy, QuantStudyWritesTheReportOfItsOwnRun) {
  const fs::path out = fs::temp_directory_path() / ("kiln_study_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string model = (kFixtures / "resnet" / "bottleneck").string();
  const std::string photos = (kFixtures / "images" / "images").string();
  const auto r = testing::run_kiln("study quant " + model + " --calib " + photos +
                                   " --batch 1,3 --opt-level 1 --rounds 4 --quiet --json -o " + out.string());
  ASSERT_EQ(r.code, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j, nlohmann::json::parse(slurp(out / "study.json")));
  // Every precision at every batch, timed, with its plan size and kernel count.
  ASSERT_EQ(j["speed"].size(), 3u * 2u);  // fp16, fp8, int8 x batch 1, 3
  for (const auto& s : j["speed"]) {
    EXPECT_GT(s["median_ms"].get<double>(), 0.0) << s.dump();
    EXPECT_LE(s["min_ms"].get<double>(), s["median_ms"].get<double>());
    EXPECT_GT(s["kernels_per_call"].get<int>(), 0);
    EXPECT_GT(s["plan_mib"].get<double>(), 0.0);
    if (s["precision"] == "fp16") EXPECT_DOUBLE_EQ(s["speedup_over_fp16"].get<double>(), 1.0);
  }
  // Quality against kiln's fp32 engine: the 16-bit engine is close, the 8-bit
  // ones within what seeded weights allow, and nothing non-finite anywhere.
  ASSERT_EQ(j["quality"].size(), 3u);
  for (const auto& q : j["quality"]) {
    const double cos = q["min_cosine"];
    EXPECT_GT(cos, q["precision"] == "fp16" ? 0.9999 : 0.95) << q.dump();
    EXPECT_LE(cos, 1.0 + 1e-9);
    EXPECT_GT(q["images"].get<int>(), 4);
    for (const auto& [name, n] : q["nonfinite_outputs"].items()) EXPECT_EQ(n, 0) << q["precision"] << " " << name;
  }
  // Where the time goes: per layer group, for each precision (steps counted).
  ASSERT_EQ(j["profiles"].size(), 3u);
  for (const auto& [p, prof] : j["profiles"].items()) {
    EXPECT_GT(prof["groups"].size(), 3u) << p;
    int steps = 0;
    for (const auto& g : prof["groups"]) steps += g["steps"].get<int>();
    EXPECT_EQ(steps, static_cast<int>(prof["layers"].size())) << p;
  }
  // The report: the regenerating command and the tables, with this run's numbers.
  const std::string md = slurp(out / "REPORT.md");
  EXPECT_NE(md.find("Regenerate: `kiln study quant " + model), std::string::npos);
  EXPECT_NE(md.find("| fp8 | 1 | 3 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| layer1 |"), std::string::npos) << md;
  std::ostringstream cos;
  cos.precision(6);
  cos << std::fixed << j["quality"][1]["min_cosine"].get<double>();
  EXPECT_NE(md.find(cos.str()), std::string::npos) << "the report's cosine is not the run's";
  for (const char* p : {"fp32_o1.bundle", "fp16_o1.bundle", "fp8_o1.bundle", "int8_o1.bundle"})
    EXPECT_TRUE(fs::exists(out / "bundles" / p)) << p;
  // The decision follows this run's ratios (TRTMC's 5 % rule) for each 8-bit precision.
  EXPECT_NE(md.find("## Decision"), std::string::npos) << md;
  for (const char* p : {"fp8", "int8"}) {
    int faster = 0, slower = 0, timed = 0;
    for (const auto& s : j["speed"])
      if (s["precision"] == p) {
        const double x = s["speedup_over_fp16"];
        faster += x >= 1.05, slower += x < 0.95, ++timed;
      }
    const std::string verdict = slower == timed   ? std::string("**Keep fp16**: ") + p + " is slower"
                                : faster == timed ? std::string("**") + p + " pays**"
                                                  : std::string("**") + p + " is mixed**";
    EXPECT_NE(md.find(verdict), std::string::npos) << p << "\n" << md;
  }
  for (const char* sec : {"## Recipe variants", "## What was not tried", "## When to revisit"})
    EXPECT_NE(md.find(sec), std::string::npos) << sec;
  // --report-from renders the same report from study.json alone, building nothing.
  const fs::path again = out / "again";
  auto rr = testing::run_kiln("study quant --report-from " + (out / "study.json").string() + " -o " + again.string());
  ASSERT_EQ(rr.code, 0) << rr.all();
  EXPECT_EQ(slurp(again / "REPORT.md"), md);
  // The report --report-from renders from an edited study.json (`name`.json, then REPORT.md in out/`name`).
  auto report_from = [&](const nlohmann::json& study, const std::string& name) {
    std::ofstream(out / (name + ".json")) << study.dump();
    const auto run = testing::run_kiln("study quant --report-from " + (out / (name + ".json")).string() + " -o " +
                                       (out / name).string());
    EXPECT_EQ(run.code, 0) << run.all();
    return slurp(out / name / "REPORT.md");
  };
  // Profiles that name their kernels (CUDA since session 18): the group table
  // counts kernels, and the report lists the launches per kernel and the
  // layers launching more than one. Here the CPU run's profiles, given names.
  {
    nlohmann::json k = j;
    for (auto& [p, prof] : k["profiles"].items()) {
      for (auto& l : prof["layers"]) l["kernels"] = {"kiln::cuda::map_kernel"};
      prof["layers"][1]["kernels"] = {"sm90_xmma_gemm", "kiln::cuda::quant_epilogue_kernel"};
      for (auto& g : prof["groups"]) g["kernels"] = g["steps"];
    }
    // The second layer's group gets its extra kernel.
    for (auto& [p, prof] : k["profiles"].items()) {
      const std::string second = prof["layers"][1]["name"];
      for (auto& g : prof["groups"])
        if (second.starts_with(g["group"].get<std::string>())) {
          g["kernels"] = g["kernels"].get<int>() + 1;
          break;
        }
    }
    const std::string km = report_from(k, "listed");
    EXPECT_NE(km.find("| fp8 ms (kernels) |"), std::string::npos) << km;
    EXPECT_NE(km.find("Launches per call by kernel"), std::string::npos) << km;
    const std::string second = k["profiles"]["fp8"]["layers"][1]["name"];
    EXPECT_NE(km.find("`" + second + "` (sm90_xmma_gemm + kiln::cuda::quant_epilogue_kernel)"), std::string::npos) << km;
    const size_t layers = k["profiles"]["fp8"]["layers"].size();
    EXPECT_NE(km.find("- fp8: " + std::to_string(layers - 1) + "× `kiln::cuda::map_kernel`"), std::string::npos) << km;
  }
  // A profile whose kernel listing failed (a diagnostic): the times and the
  // report stand, the report says why the lists are missing.
  {
    nlohmann::json k = j;
    k["profiles"]["fp8"]["kernels_unavailable"] = "cuda error cudaErrorLossyQuery in cudaGraphNodeGetDependentNodes";
    const std::string um = report_from(k, "unlisted");
    EXPECT_NE(um.find("Kernel names unavailable (fp8): cuda error cudaErrorLossyQuery"), std::string::npos) << um;
    EXPECT_EQ(um.find("Launches per call by kernel"), std::string::npos) << um;
    EXPECT_NE(um.find("## Where the time goes"), std::string::npos) << um;
  }
  // A file that is not a study's: an input error naming it, nothing written.
  std::ofstream(out / "bad.json") << "{\"speed\": 3";
  rr = testing::run_kiln("study quant --report-from " + (out / "bad.json").string() + " -o " + (out / "bad").string());
  EXPECT_EQ(rr.code, 2) << rr.all();
  EXPECT_NE(rr.all().find("bad.json: not a study.json"), std::string::npos) << rr.all();
  std::ofstream(out / "other.json") << "{\"speed\": []}";
  rr = testing::run_kiln("study quant --report-from " + (out / "other.json").string() + " -o " + (out / "bad").string());
  EXPECT_EQ(rr.code, 2) << rr.all();
  EXPECT_NE(rr.all().find("other.json: not a study.json of kiln study quant"), std::string::npos) << rr.all();
  EXPECT_FALSE(fs::exists(out / "bad" / "REPORT.md"));
  fs::remove_all(out);
}

// Recipe variants in one run: `--recipe default,wide.json` builds one 8-bit
// variant per precision and recipe of that precision, labelled
// precision:stem, timed interleaved with fp16 and compared like the others; a
// missing recipe file or two recipes with one stem are refused before
// anything is written.
TEST(CliStudy, QuantStudyComparesRecipesInOneRun) {
  const fs::path out = fs::temp_directory_path() / ("kiln_study_recipes_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const fs::path recipes = fs::temp_directory_path() / ("kiln_study_recipe_files_" + std::to_string(::getpid()));
  fs::create_directories(recipes / "again");
  std::ofstream(recipes / "wide.json") << R"({"format": 1, "precision": "fp8", "residuals": "wide"})";
  std::ofstream(recipes / "again" / "wide.json") << R"({"format": 1, "precision": "fp8"})";
  const std::string model = (kFixtures / "resnet" / "bottleneck").string();
  const std::string photos = (kFixtures / "images" / "images").string();
  const std::string wide = (recipes / "wide.json").string();
  const auto r = testing::run_kiln("study quant " + model + " --calib " + photos + " --recipe default," + wide +
                                   " --precisions fp8,int8 --batch 1 --opt-level 1 --rounds 3 --quiet --json -o " + out.string());
  ASSERT_EQ(r.code, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> speed, quality;
  for (const auto& x : j["speed"]) speed.insert(x["precision"].get<std::string>());
  for (const auto& x : j["quality"]) quality.insert(x["precision"].get<std::string>());
  // wide.json is an fp8 recipe: it builds no int8 variant.
  EXPECT_EQ(speed, (std::set<std::string>{"fp16", "fp8:default", "fp8:wide", "int8:default"}));
  EXPECT_EQ(quality, speed);
  EXPECT_EQ(j["profiles"].size(), 4u);
  for (const char* b : {"fp8_default_o1.bundle", "fp8_wide_o1.bundle", "int8_default_o1.bundle"})
    EXPECT_TRUE(fs::exists(out / "bundles" / b)) << b;
  EXPECT_FALSE(fs::exists(out / "bundles" / "int8_wide_o1.bundle"));
  const std::string md = slurp(out / "REPORT.md");
  EXPECT_NE(md.find("| fp8:wide | 1 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("fp8:wide = " + wide), std::string::npos) << md;
  EXPECT_NE(md.find("--recipe default," + wide), std::string::npos) << "the regenerating command lacks the recipes";
  // A variant that cannot be built is reported (stderr, study.json, the report) and the study goes on.
  std::ofstream(recipes / "typo.json") << R"({"format": 1, "precision": "fp8", "parts": ["layer9"]})";
  const fs::path out2 = out / "with_typo";
  const auto r2 = testing::run_kiln("study quant " + model + " --calib " + photos + " --recipe default," +
                                    (recipes / "typo.json").string() +
                                    " --precisions fp8 --batch 1 --opt-level 1 --rounds 2 --json -o " + out2.string());
  ASSERT_EQ(r2.code, 0) << r2.all();
  const auto j2 = nlohmann::json::parse(r2.out);
  ASSERT_EQ(j2["failed_builds"].size(), 1u) << j2["failed_builds"].dump();
  EXPECT_EQ(j2["failed_builds"][0]["precision"], "fp8:typo");
  EXPECT_NE(j2["failed_builds"][0]["error"].get<std::string>().find("layer9"), std::string::npos);
  EXPECT_NE(r2.err.find("fp8:typo at opt level 1 not built"), std::string::npos) << r2.err;
  EXPECT_EQ(j2["speed"].size(), 2u);  // fp16 and fp8:default
  EXPECT_NE(slurp(out2 / "REPORT.md").find("## Variants not built"), std::string::npos);
  // Refused before anything is built or written.
  const fs::path bad = out / "refused";
  auto rr = testing::run_kiln("study quant " + model + " --calib " + photos + " --recipe " + (recipes / "none.json").string() +
                              " --quiet -o " + bad.string());
  EXPECT_EQ(rr.code, 2) << rr.all();
  EXPECT_NE(rr.all().find("none.json: no such recipe file"), std::string::npos) << rr.all();
  rr = testing::run_kiln("study quant " + model + " --calib " + photos + " --recipe " + wide + "," +
                         (recipes / "again" / "wide.json").string() + " --quiet -o " + bad.string());
  EXPECT_EQ(rr.code, 1) << rr.all();
  EXPECT_NE(rr.all().find("share the label 'fp8:wide'"), std::string::npos) << rr.all();
  EXPECT_FALSE(fs::exists(bad));
  fs::remove_all(out);
  fs::remove_all(recipes);
}

// The demo model with its labelled held-out split: each variant's top-1
// accuracy, 8-bit within 0.3 points of fp32 (issue 13's bar against fp16).
TEST(CliStudy, QuantStudyReportsAccuracyAgainstLabels) {
  const fs::path digits = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path() / "models" / "digits_resnet";
  const fs::path out = fs::temp_directory_path() / ("kiln_study_acc_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const auto r = testing::run_kiln("study quant " + digits.string() + " --calib " + (digits / "samples").string() +
                                   " --accuracy " + (digits / "heldout").string() +
                                   " --batch 1 --opt-level 1 --rounds 3 --quiet --json -o " + out.string());
  ASSERT_EQ(r.code, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  const double fp32 = j["accuracy_set"]["fp32_accuracy"];
  EXPECT_EQ(j["accuracy_set"]["images"], 360);
  EXPECT_GT(fp32, 0.95);  // the trained demo model
  for (const auto& q : j["quality"]) EXPECT_NEAR(q["accuracy"].get<double>(), fp32, 0.003) << q["precision"];
  EXPECT_NE(slurp(out / "REPORT.md").find("## Accuracy against labels (360 images"), std::string::npos);
  fs::remove_all(out);
}

// A detector (the trained RT-DETR v2 demo): calibration on its samples, quality as the 16-bit
// detection rule per image against kiln's fp32 engine, non-finite scan of logits and boxes.
TEST(CliStudy, QuantStudyOfADetector) {
  const fs::path demo = fs::path(KILN_FIXTURES_DIR).parent_path().parent_path() / "models" / "rtdetr_demo";
  if (!fs::exists(demo / "config.json")) GTEST_SKIP() << "models/rtdetr_demo not present";
  const fs::path out = fs::temp_directory_path() / ("kiln_study_det_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const auto r = testing::run_kiln("study quant " + demo.string() + " --calib " + (demo / "samples").string() +
                                   " --precisions int8 --batch 1 --opt-level 1 --rounds 2 --quality-images 3 --quiet --json -o " +
                                   out.string());
  ASSERT_EQ(r.code, 0) << r.all();
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["quality"].size(), 2u);  // fp16, int8
  for (const auto& q : j["quality"]) {
    EXPECT_EQ(q["images"], 3) << q["precision"];
    EXPECT_GT(q["reference_detections"].get<int>(), 3) << q["precision"];  // a trained model finds its shapes
    EXPECT_GT(q["min_cosine"].get<double>(), 0.9) << q["precision"];
    for (const auto& [name, n] : q["nonfinite_outputs"].items()) EXPECT_EQ(n, 0) << q["precision"] << " " << name;
  }
  EXPECT_EQ(j["quality"][0]["precision"], "fp16");
  EXPECT_EQ(j["quality"][0]["detection_agreement"], 1.0) << j["quality"][0]["first_mismatch"];
  const std::string report = slurp(out / "REPORT.md");
  EXPECT_NE(report.find("| precision | detection agreement |"), std::string::npos);
  EXPECT_NE(report.find("kiln eval BUNDLE --coco"), std::string::npos);
  fs::remove_all(out);
}

// The layer groups of kiln bench --profile and the study's table.
TEST(LayerGroups, TimmStagesAndHuggingFaceParts) {
  using cli::group_of;
  EXPECT_EQ(group_of("layer2.1.conv2"), "layer2");
  EXPECT_EQ(group_of("conv1"), "conv1");
  EXPECT_EQ(group_of("blocks.3.1.conv_dw"), "blocks.3");
  EXPECT_EQ(group_of("pixel_values.to_nhwc"), "pixel_values");
  EXPECT_EQ(group_of("global_pool.flatten"), "global_pool");
  EXPECT_EQ(group_of("model.backbone.model.embedder.embedder.0.convolution"), "model.backbone");
  EXPECT_EQ(group_of("model.encoder.fpn_blocks.0.conv1"), "model.encoder");
  EXPECT_EQ(group_of("model.decoder.layers.0.encoder_attn.sampling_offsets"), "model.decoder");
  EXPECT_EQ(group_of("model.topk"), "model");
}

// RT-DETR v2's own groups (the issue's table): AIFI apart from the rest of the
// encoder, query selection apart from the decoder; a family kiln lacks, or a
// name no group claims, falls back to group_of.
TEST(LayerGroups, RtDetrFamilyGroups) {
  const auto g = cli::LayerGrouping::of_family("rt_detr_v2");
  EXPECT_EQ(g("pixel_values.to_nhwc"), "input");
  EXPECT_EQ(g("model.backbone.model.embedder.pooler"), "backbone");
  EXPECT_EQ(g("model.encoder.encoder.0.layers.0.self_attn.attention"), "AIFI");
  EXPECT_EQ(g("model.encoder.fpn_blocks.0.conv1.conv"), "encoder");
  EXPECT_EQ(g("model.encoder_input_proj.2.0"), "encoder");
  EXPECT_EQ(g("model.decoder_input_proj.0.0"), "query selection");
  EXPECT_EQ(g("model.enc_class_max"), "query selection");
  EXPECT_EQ(g("model.topk"), "query selection");
  EXPECT_EQ(g("model.decoder.layers.0.encoder_attn.core"), "decoder");
  EXPECT_EQ(g("logits.to_f32"), "output");
  EXPECT_EQ(g("layer2.1.conv2"), "layer2");
  const auto none = cli::LayerGrouping::of_family("no_such_family");
  EXPECT_EQ(none("model.encoder.encoder.0.layers.0.fc1"), "model.encoder");
  EXPECT_EQ(cli::LayerGrouping::of_family("timm_resnet")("layer2.1.conv2"), "layer2");
}

TEST(CliStudy, QuantStudyRefusesBadArguments) {
  const std::string model = (kFixtures / "resnet" / "bottleneck").string();
  auto r = testing::run_kiln("study quant " + model);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.all().find("--calib"), std::string::npos) << r.all();
  r = testing::run_kiln("study quant " + model + " --calib /nonexistent_kiln_dir --quiet -o /tmp/kiln_study_bad");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.all().find("/nonexistent_kiln_dir: not a folder"), std::string::npos) << r.all();
  EXPECT_FALSE(std::filesystem::exists("/tmp/kiln_study_bad")) << "a refused study wrote its folder";
  r = testing::run_kiln("study quant " + model + " --calib /tmp --precisions fp4 --quiet -o /tmp/kiln_study_bad");
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_NE(r.all().find("fp4"), std::string::npos) << r.all();
  std::filesystem::remove_all("/tmp/kiln_study_bad");
}

}  // namespace
}  // namespace kiln
