// COCO box evaluation with pycocotools' rules (COCOeval, iouType "bbox"),
// re-implemented step for step so `kiln eval --coco` gives pycocotools'
// numbers (checked against it to 1e-6, tests/fixtures/coco/):
//   - images: every image of the annotation file (or a subset), sorted by id;
//     categories: every category of the file, sorted by id;
//   - per image and category: detections sorted by score (stable), the first
//     100 kept; IoU of boxes, for a crowd GT intersection / detection area;
//   - greedy matching per IoU threshold .50:.05:.95 (np.linspace values), a
//     GT matched once unless crowd, crowd and out-of-area GTs "ignored";
//     unmatched detections outside the area range ignored;
//   - area ranges all [0, 1e10], small [0, 32^2], medium [32^2, 96^2],
//     large [96^2, 1e10] on the GT's `area` field and the detection's w*h;
//   - maxDets 1, 10, 100; 101-point interpolated precision (recall
//     thresholds 0:.01:1, precision made monotone, np.searchsorted left);
//   - averages over the entries that are not -1 (a category without GT, or
//     without any detection or GT in an area range, is -1 and left out).
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln {

struct CocoBox {
  double x = 0, y = 0, w = 0, h = 0;  // COCO [x, y, width, height]
};

struct CocoImage {
  int64_t id = 0;
  std::string file_name;
  int width = 0, height = 0;  // 0 when the file does not say
};

struct CocoCategory {
  int64_t id = 0;
  std::string name;
};

struct CocoAnnotation {
  int64_t id = 0, image_id = 0, category_id = 0;
  CocoBox bbox;
  double area = 0;
  bool iscrowd = false;
};

struct CocoDataset {
  std::vector<CocoImage> images;
  std::vector<CocoCategory> categories;
  std::vector<CocoAnnotation> annotations;
};

struct CocoDetection {
  int64_t image_id = 0, category_id = 0;
  CocoBox bbox;
  double score = 0;
};

// A COCO instances file ("images", "annotations", "categories"; other keys
// are ignored). Every entry is checked: types, a 4-number bbox with w, h >= 0,
// `area`, unique ids, annotations naming known images and categories. Errors
// are Error(Input) naming `source` and the entry, e.g.
// "val.json: annotations[12]: key 'bbox' must be 4 numbers".
CocoDataset parse_coco_dataset(const std::string& text, const std::string& source);
CocoDataset read_coco_dataset(const std::filesystem::path& path);
// A COCO results file: a list of {"image_id", "category_id", "bbox", "score"}.
std::vector<CocoDetection> parse_coco_results(const std::string& text, const std::string& source);

struct CocoEvalResult {
  // pycocotools' COCOeval.stats: AP@[.5:.95], AP50, AP75, AP small, medium,
  // large (maxDets 100); AR maxDets 1, 10, 100; AR small, medium, large.
  std::array<double, 12> stats{};
  std::map<int64_t, double> ap_per_category;  // AP@[.5:.95], area all, 100 dets; -1 without GT
  size_t images = 0, detections = 0, ground_truth = 0;
};

// `image_ids`: the images to evaluate (empty: all of the dataset's).
// Detections of unknown images are an Error(Input); of categories not in the
// dataset, ignored (as pycocotools).
CocoEvalResult coco_evaluate(const CocoDataset& gt, const std::vector<CocoDetection>& dets,
                             std::vector<int64_t> image_ids = {});

}  // namespace kiln
