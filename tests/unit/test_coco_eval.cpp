// COCO box evaluation against pycocotools itself: synthetic ground truth and
// detection sets with the stats COCOeval gave for them
// (tools/reference/coco_eval_fixtures.py), plus the annotation parser's errors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "graph_test_util.hpp"
#include "tasks/coco_eval.hpp"

#ifndef KILN_FIXTURES_DIR
#error "compile with -DKILN_FIXTURES_DIR"
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
const fs::path kCoco = fs::path(KILN_FIXTURES_DIR) / "coco";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(CocoEval, MatchesPycocotoolsOnSyntheticSets) {
  const json expected = json::parse(slurp(kCoco / "expected.json"));
  int cases = 0;
  for (const auto& c : expected["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const CocoDataset gt = read_coco_dataset(kCoco / c["gt"].get<std::string>());
    const auto dets = parse_coco_results(slurp(kCoco / c["dets"].get<std::string>()), c["dets"]);
    std::vector<int64_t> ids;
    if (c.contains("image_ids")) ids = c["image_ids"].get<std::vector<int64_t>>();
    const CocoEvalResult r = coco_evaluate(gt, dets, ids);
    for (size_t s = 0; s < 12; ++s) EXPECT_NEAR(r.stats[s], c["stats"][s].get<double>(), 1e-6) << "stat " << s;
    for (const auto& [cat, ap] : c["ap_per_category"].items())
      EXPECT_NEAR(r.ap_per_category.at(std::stoll(cat)), ap.get<double>(), 1e-6) << "category " << cat;
    ++cases;
  }
  EXPECT_EQ(cases, 9);
}

TEST(CocoEval, HandComputedSmallCase) {
  // One image, one GT 10x10 at (0, 0), area 100 (small). Two detections:
  // an exact one (score 0.9) and a miss (0.8). Precision at every recall
  // threshold is 1 (the first detection reaches recall 1): AP = 1 at every
  // IoU; a third detection scoring higher but off the box halves it.
  CocoDataset gt;
  gt.images = {{1, "a.jpg", 100, 100}};
  gt.categories = {{1, "a"}};
  gt.annotations = {{5, 1, 1, {0, 0, 10, 10}, 100, false}};
  std::vector<CocoDetection> dets = {{1, 1, {0, 0, 10, 10}, 0.9}, {1, 1, {50, 50, 10, 10}, 0.8}};
  CocoEvalResult r = coco_evaluate(gt, dets);
  EXPECT_DOUBLE_EQ(r.stats[0], 1.0);
  EXPECT_DOUBLE_EQ(r.stats[3], 1.0);   // small
  EXPECT_DOUBLE_EQ(r.stats[4], -1.0);  // no medium GT
  EXPECT_DOUBLE_EQ(r.stats[8], 1.0);
  dets.push_back({1, 1, {60, 0, 10, 10}, 0.95});
  r = coco_evaluate(gt, dets);
  // tp/(tp+fp) at the match: 1/2 for every recall threshold.
  EXPECT_NEAR(r.stats[0], 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(r.stats[6], 0.0);  // AR@1: the top detection misses
  // A crowd GT covering a detection: neither a hit nor a false positive.
  gt.annotations.push_back({6, 1, 1, {40, 40, 40, 40}, 1600, true});
  r = coco_evaluate(gt, dets);
  EXPECT_NEAR(r.stats[0], 0.5, 1e-12);
}

TEST(CocoEval, ParserNamesTheEntryAtFault) {
  const auto err = [](const std::string& text) {
    return testing::error_of([&] { parse_coco_dataset(text, "val.json"); });
  };
  const std::string ok_head = R"({"images": [{"id": 1, "file_name": "a.jpg"}], "categories": [{"id": 3, "name": "x"}], )";
  EXPECT_NE(err("[1, 2]").find("val.json: a COCO annotation file is a JSON object"), std::string::npos);
  EXPECT_NE(err("{\"images\": [").find("val.json: not valid JSON"), std::string::npos);
  EXPECT_NE(err(R"({"images": [], "categories": []})").find("missing key 'annotations'"), std::string::npos);
  EXPECT_NE(err(ok_head + R"("annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 3], "area": 1}]})")
                .find("val.json: annotations[0]: key 'bbox' must be 4 numbers"),
            std::string::npos);
  EXPECT_NE(err(ok_head + R"("annotations": [{"id": 1, "image_id": 2, "category_id": 3, "bbox": [1, 2, 3, 4], "area": 1}]})")
                .find("annotations[0]: image_id 2 is not in 'images'"),
            std::string::npos);
  EXPECT_NE(err(ok_head + R"("annotations": [{"id": 1, "image_id": 1, "category_id": 4, "bbox": [1, 2, 3, 4], "area": 1}]})")
                .find("category_id 4 is not in 'categories'"),
            std::string::npos);
  EXPECT_NE(err(ok_head + R"("annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, -3, 4], "area": 1}]})")
                .find("must not be negative"),
            std::string::npos);
  EXPECT_NE(err(ok_head + R"("annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 3, 4]}]})")
                .find("annotations[0]: missing key 'area'"),
            std::string::npos);
  EXPECT_NE(err(ok_head + R"("annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 3, 4], "area": 1},
                                             {"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 3, 4], "area": 1}]})")
                .find("annotations[1]: annotation id 1 appears twice"),
            std::string::npos);
  EXPECT_NE(err(ok_head + R"("annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 3, 4], "area": 1, "iscrowd": 2}]})")
                .find("'iscrowd' must be 0 or 1"),
            std::string::npos);
  EXPECT_NE(err(R"({"images": [{"id": 1}], "categories": [], "annotations": []})").find("images[0]: missing key 'file_name'"),
            std::string::npos);
  const auto d = parse_coco_dataset(ok_head + R"("annotations": []})", "val.json");
  EXPECT_EQ(d.images.size(), 1u);
  EXPECT_NE(testing::error_of([&] { coco_evaluate(d, {{9, 3, {0, 0, 1, 1}, 0.5}}); }).find("image id 9"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { parse_coco_results(R"([{"image_id": 1, "bbox": [0, 0, 1, 1], "score": 1}])", "r.json"); })
                .find("r.json[0]: missing key 'category_id'"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
