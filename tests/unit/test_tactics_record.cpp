// The CUDA tactics section (bundle/tactics_record.hpp) is checked without a
// GPU: a well-formed record passes as written, and every wrong type is an
// Error(Input) naming the section and the key path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bundle/tactics_record.hpp"
#include "core/error.hpp"

namespace kiln {
namespace {

nlohmann::json good() {
  return nlohmann::json::parse(R"({
    "key": {"gpu": "NVIDIA H200", "driver": 13000, "cudnn": 91400, "cublaslt": 130000},
    "opt_level": 3,
    "layers": {"conv1": {"tactic": "eng4_k24=12", "time_us": 10.5}},
    "batches": {"1": {"layers": {"conv1": {"tactic": "eng4_k24=12"}},
                      "plan": {"window_conv": false, "channel_views": false, "arena_bytes": 4096,
                               "workspace_bytes": 0, "steps": [["conv1", "cudnn eng4_k24=12"], ["conv2", "cudnn eng0"],
                                                               ["conv3", "cudnn eng0"]],
                               "side_lane": [{"steps": [1], "fork": 0, "join": 3}],
                               "linear_norm": ["dec.0.norm1"], "concat_mask": [], "late_side_fork": true, "chain_side_fork": true,
                               "weight_prefetch": true,
                               "values": {"pixel_values": [0, 0]}}}}
  })");
}

std::string error_of(const nlohmann::json& j) {
  try {
    parse_tactics_record(j.dump(), "m.bundle: tactics.h200.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    return e.what();
  }
  return "";
}

TEST(TacticsRecord, AWellFormedRecordPasses) {
  EXPECT_EQ(parse_tactics_record(good().dump(), "x"), good());
  EXPECT_EQ(error_of(nlohmann::json::object()), "");  // every part optional
  // window_conv: the view blocks run as window convs; true/false in older bundles.
  for (const nlohmann::json& w : {nlohmann::json(true), nlohmann::json::array(), nlohmann::json({"layer1.0", "layer3.0"})}) {
    nlohmann::json j = good();
    j["batches"]["1"]["plan"]["window_conv"] = w;
    EXPECT_EQ(error_of(j), "") << w.dump();
    EXPECT_EQ(parse_tactics_record(j.dump(), "x")["batches"]["1"]["plan"]["window_conv"], w);
  }
}

TEST(TacticsRecord, WrongTypesNameTheSectionAndKey) {
  auto says = [](const std::function<void(nlohmann::json&)>& edit, const std::string& what) {
    nlohmann::json j = good();
    edit(j);
    const std::string e = error_of(j);
    EXPECT_NE(e.find("m.bundle: tactics.h200.json"), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << "wanted '" << what << "' in: " << e;
  };
  says([](auto& j) { j["key"] = 7; }, "'key' must be an object");
  says([](auto& j) { j["key"]["gpu"] = 1; }, "'key.gpu' must be a string");
  says([](auto& j) { j["key"]["cudnn"] = "9.14"; }, "'key.cudnn' must be a non-negative integer");
  says([](auto& j) { j["opt_level"] = "3"; }, "'opt_level' must be an integer");
  says([](auto& j) { j["layers"]["conv1"] = "eng4"; }, "'layers.conv1' must be an object");
  says([](auto& j) { j["layers"]["conv1"].erase("tactic"); }, "'layers.conv1.tactic' must be present");
  says([](auto& j) { j["layers"]["conv1"]["time_us"] = "fast"; }, "'layers.conv1.time_us' must be a number");
  says([](auto& j) { j["batches"] = nlohmann::json::array(); }, "'batches' must be an object");
  says([](auto& j) { j["batches"]["0"] = j["batches"]["1"]; }, "'batches.0' must be keyed by a positive batch size");
  says([](auto& j) { j["batches"]["x1"] = j["batches"]["1"]; }, "'batches.x1' must be keyed");
  says([](auto& j) { j["batches"]["1"]["plan"] = 7; }, "'batches.1.plan' must be an object");
  says([](auto& j) { j["batches"]["1"]["plan"]["window_conv"] = "yes"; },
       "'batches.1.plan.window_conv' must be a list of view block names (or true/false)");
  says([](auto& j) { j["batches"]["1"]["plan"]["window_conv"] = {"layer1.0", 3}; },
       "'batches.1.plan.window_conv[1]' must be a view block name");
  says([](auto& j) { j["batches"]["1"]["plan"]["window_conv"] = {""}; }, "'batches.1.plan.window_conv[0]' must be a view block name");
  says([](auto& j) { j["batches"]["1"]["plan"]["arena_bytes"] = -64; }, "'batches.1.plan.arena_bytes' must be a non-negative");
  says([](auto& j) { j["batches"]["1"]["plan"]["steps"] = "conv1"; }, "'batches.1.plan.steps' must be a list");
  says([](auto& j) { j["batches"]["1"]["plan"]["steps"][0] = {"conv1"}; }, "'batches.1.plan.steps[0]' must be [node name");
  says([](auto& j) { j["batches"]["1"]["plan"]["side_lane"] = "steps 1"; }, "'batches.1.plan.side_lane' must be a list");
  says([](auto& j) { j["batches"]["1"]["plan"]["side_lane"][0]["join"] = 4; },
       "'batches.1.plan.side_lane[0].join' must be a step index (at most the step count)");
  says([](auto& j) { j["batches"]["1"]["plan"]["side_lane"][0]["fork"] = 3; },
       "'batches.1.plan.side_lane[0].fork' must be a step index before the join");
  says([](auto& j) { j["batches"]["1"]["plan"]["side_lane"][0]["fork"] = -1; },
       "'batches.1.plan.side_lane[0].fork' must be a step index before the join");
  says([](auto& j) { j["batches"]["1"]["plan"]["side_lane"][0]["steps"] = nlohmann::json::array(); },
       "'batches.1.plan.side_lane[0].steps' must be a non-empty list");
  says([](auto& j) { j["batches"]["1"]["plan"]["side_lane"][0]["steps"] = {1, 3}; },
       "'batches.1.plan.side_lane[0].steps[1]' must be a step index (below the step count)");
  says([](auto& j) { j["batches"]["1"]["plan"]["side_lane"][0] = 1; }, "'batches.1.plan.side_lane[0]' must be an object");
  says([](auto& j) { j["batches"]["1"]["plan"]["linear_norm"] = "dec.0.norm1"; }, "'batches.1.plan.linear_norm' must be a list");
  says([](auto& j) { j["batches"]["1"]["plan"]["linear_norm"][0] = ""; },
       "'batches.1.plan.linear_norm[0]' must be a node name (a non-empty string)");
  says([](auto& j) { j["batches"]["1"]["plan"]["concat_mask"] = {"model.memory.masked", 3}; },
       "'batches.1.plan.concat_mask[1]' must be a node name (a non-empty string)");
  says([](auto& j) { j["batches"]["1"]["plan"]["late_side_fork"] = "yes"; },
       "'batches.1.plan.late_side_fork' must be true or false");
  says([](auto& j) { j["batches"]["1"]["plan"]["chain_side_fork"] = 1; },
       "'batches.1.plan.chain_side_fork' must be true or false");
  says([](auto& j) { j["batches"]["1"]["plan"]["weight_prefetch"] = 1; },
       "'batches.1.plan.weight_prefetch' must be true or false");
  says([](auto& j) { j["batches"]["1"]["plan"]["values"]["pixel_values"] = {0, "8"}; },
       "'batches.1.plan.values.pixel_values' must be [arena offset");
  EXPECT_NE(error_of(nlohmann::json::array()).find("not a JSON object"), std::string::npos);
  try {
    parse_tactics_record("{\"key\": ", "m.bundle: tactics.h200.json");
    FAIL() << "truncated JSON accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a JSON object"), std::string::npos);
  }
}

}  // namespace
}  // namespace kiln
