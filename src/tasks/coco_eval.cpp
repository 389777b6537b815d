// COCO box mAP as pycocotools computes it (see coco_eval.hpp for the rules).
// Names follow pycocotools' COCOeval (evaluateImg, accumulate, summarize) so
// the two can be read side by side.
#include "tasks/coco_eval.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace kiln {
namespace {

using nlohmann::json;

// ------------------------------------------------------------- parsing --

const json& key(const json& obj, const char* k, const std::string& where) {
  auto it = obj.find(k);
  if (it == obj.end()) fail_input(where, ": missing key '", k, "'");
  return *it;
}

int64_t int_key(const json& obj, const char* k, const std::string& where) {
  const json& v = key(obj, k, where);
  if (v.is_number_integer()) return v.get<int64_t>();
  // COCO files written by numpy-based tools sometimes hold ids as 3.0.
  if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
      std::fabs(v.get<double>()) < 9e15)
    return static_cast<int64_t>(v.get<double>());
  fail_input(where, ": key '", k, "' must be an integer");
}

double number_key(const json& obj, const char* k, const std::string& where) {
  const json& v = key(obj, k, where);
  if (!v.is_number() || !std::isfinite(v.get<double>())) fail_input(where, ": key '", k, "' must be a finite number");
  return v.get<double>();
}

CocoBox bbox_key(const json& obj, const std::string& where) {
  const json& v = key(obj, "bbox", where);
  if (!v.is_array() || v.size() != 4) fail_input(where, ": key 'bbox' must be 4 numbers [x, y, width, height]");
  double b[4];
  for (size_t i = 0; i < 4; ++i) {
    if (!v[i].is_number() || !std::isfinite(v[i].get<double>()))
      fail_input(where, ": key 'bbox' must be 4 finite numbers [x, y, width, height]");
    b[i] = v[i].get<double>();
  }
  if (b[2] < 0 || b[3] < 0) fail_input(where, ": bbox width and height must not be negative");
  return {b[0], b[1], b[2], b[3]};
}

const json& array_key(const json& obj, const char* k, const std::string& source) {
  const json& v = key(obj, k, source);
  if (!v.is_array()) fail_input(source, ": key '", k, "' must be a list");
  return v;
}

json parse_json(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) fail_input(source, ": not valid JSON");
  return j;
}

std::string entry(const std::string& source, const char* list, size_t i) {
  return source + ": " + list + "[" + std::to_string(i) + "]";
}

// ---------------------------------------------------------- evaluation --

constexpr int kT = 10, kR = 101, kA = 4, kM = 3;
constexpr int kMaxDets[kM] = {1, 10, 100};
constexpr double kAreaRng[kA][2] = {{0, 1e10}, {0, 32 * 32}, {32 * 32, 96 * 96}, {96 * 96, 1e10}};

// np.linspace(.5, .95, 10) and np.linspace(0, 1, 101): i * step + start, the
// last one set to the end point (so 0.8999999999999999 is a threshold).
std::array<double, kT> iou_thresholds() {
  std::array<double, kT> t{};
  const double step = (0.95 - 0.5) / 9;
  for (int i = 0; i < kT; ++i) t[i] = i * step + 0.5;
  t[kT - 1] = 0.95;
  return t;
}
std::array<double, kR> recall_thresholds() {
  std::array<double, kR> r{};
  const double step = 1.0 / 100;
  for (int i = 0; i < kR; ++i) r[i] = i * step;
  r[kR - 1] = 1.0;
  return r;
}

// maskApi.c bbIou: intersection over union, or over the detection's area
// for a crowd GT.
double box_iou(const CocoBox& d, const CocoBox& g, bool crowd) {
  const double w = std::fmin(d.w + d.x, g.w + g.x) - std::fmax(d.x, g.x);
  if (w <= 0) return 0;
  const double h = std::fmin(d.h + d.y, g.h + g.y) - std::fmax(d.y, g.y);
  if (h <= 0) return 0;
  const double i = w * h, da = d.w * d.h, ga = g.w * g.h;
  const double u = crowd ? da : da + ga - i;
  return i / u;
}

struct EvalImg {
  bool valid = false;
  std::vector<double> dt_scores;                     // D, highest first
  std::vector<std::array<int64_t, kT>> dt_matches;   // D x T: matched GT id (0: none)
  std::vector<std::array<bool, kT>> dt_ignore;       // D x T
  std::vector<bool> gt_ignore;                       // G
};

// Stable order of `idx` by descending score (np.argsort(-s, kind='mergesort')).
void sort_by_score(std::vector<size_t>& idx, const std::vector<CocoDetection>& dets) {
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return -dets[a].score < -dets[b].score; });
}

}  // namespace

CocoDataset parse_coco_dataset(const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  if (!j.is_object()) fail_input(source, ": a COCO annotation file is a JSON object");
  CocoDataset d;
  std::set<int64_t> image_ids, category_ids, annotation_ids;
  const json& images = array_key(j, "images", source);
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string where = entry(source, "images", i);
    if (!images[i].is_object()) fail_input(where, ": must be an object");
    CocoImage im;
    im.id = int_key(images[i], "id", where);
    const json& fn = key(images[i], "file_name", where);
    if (!fn.is_string()) fail_input(where, ": key 'file_name' must be a string");
    im.file_name = fn.get<std::string>();
    if (images[i].contains("width") || images[i].contains("height")) {
      const int64_t w = int_key(images[i], "width", where), h = int_key(images[i], "height", where);
      if (w < 1 || h < 1 || w > 1000000 || h > 1000000) fail_input(where, ": width/height out of range");
      im.width = static_cast<int>(w);
      im.height = static_cast<int>(h);
    }
    if (!image_ids.insert(im.id).second) fail_input(where, ": image id ", im.id, " appears twice");
    d.images.push_back(std::move(im));
  }
  const json& cats = array_key(j, "categories", source);
  for (size_t i = 0; i < cats.size(); ++i) {
    const std::string where = entry(source, "categories", i);
    if (!cats[i].is_object()) fail_input(where, ": must be an object");
    CocoCategory c;
    c.id = int_key(cats[i], "id", where);
    if (cats[i].contains("name")) {
      if (!cats[i]["name"].is_string()) fail_input(where, ": key 'name' must be a string");
      c.name = cats[i]["name"].get<std::string>();
    }
    if (!category_ids.insert(c.id).second) fail_input(where, ": category id ", c.id, " appears twice");
    d.categories.push_back(std::move(c));
  }
  const json& anns = array_key(j, "annotations", source);
  for (size_t i = 0; i < anns.size(); ++i) {
    const std::string where = entry(source, "annotations", i);
    if (!anns[i].is_object()) fail_input(where, ": must be an object");
    CocoAnnotation a;
    a.id = int_key(anns[i], "id", where);
    a.image_id = int_key(anns[i], "image_id", where);
    a.category_id = int_key(anns[i], "category_id", where);
    a.bbox = bbox_key(anns[i], where);
    a.area = number_key(anns[i], "area", where);
    if (anns[i].contains("iscrowd")) {
      const json& c = anns[i]["iscrowd"];
      if (c.is_boolean()) a.iscrowd = c.get<bool>();
      else if (c.is_number_integer() && (c.get<int64_t>() == 0 || c.get<int64_t>() == 1)) a.iscrowd = c.get<int64_t>() == 1;
      else fail_input(where, ": key 'iscrowd' must be 0 or 1");
    }
    // pycocotools indexes annotations by id: a repeated id would silently
    // stand for the last one.
    if (!annotation_ids.insert(a.id).second) fail_input(where, ": annotation id ", a.id, " appears twice");
    if (!image_ids.count(a.image_id)) fail_input(where, ": image_id ", a.image_id, " is not in 'images'");
    if (!category_ids.count(a.category_id)) fail_input(where, ": category_id ", a.category_id, " is not in 'categories'");
    d.annotations.push_back(a);
  }
  return d;
}

CocoDataset read_coco_dataset(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_input(path.string(), ": cannot open the COCO annotation file");
  std::ostringstream s;
  s << f.rdbuf();
  return parse_coco_dataset(s.str(), path.string());
}

std::vector<CocoDetection> parse_coco_results(const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  if (!j.is_array()) fail_input(source, ": a COCO results file is a JSON list");
  std::vector<CocoDetection> r;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = source + "[" + std::to_string(i) + "]";
    if (!j[i].is_object()) fail_input(where, ": must be an object");
    CocoDetection d;
    d.image_id = int_key(j[i], "image_id", where);
    d.category_id = int_key(j[i], "category_id", where);
    d.bbox = bbox_key(j[i], where);
    d.score = number_key(j[i], "score", where);
    r.push_back(d);
  }
  return r;
}

CocoEvalResult coco_evaluate(const CocoDataset& gt, const std::vector<CocoDetection>& dets,
                             std::vector<int64_t> image_ids) {
  std::set<int64_t> known;
  for (const auto& im : gt.images) known.insert(im.id);
  if (image_ids.empty()) image_ids.assign(known.begin(), known.end());
  std::sort(image_ids.begin(), image_ids.end());
  image_ids.erase(std::unique(image_ids.begin(), image_ids.end()), image_ids.end());
  for (int64_t id : image_ids)
    if (!known.count(id)) fail_input("coco eval: image id ", id, " is not in the annotation file");
  for (const auto& d : dets)
    if (!known.count(d.image_id))
      fail_input("coco eval: a detection names image id ", d.image_id, ", which is not in the annotation file");
  std::vector<int64_t> cat_ids;
  for (const auto& c : gt.categories) cat_ids.push_back(c.id);
  std::sort(cat_ids.begin(), cat_ids.end());
  const size_t I = image_ids.size(), K = cat_ids.size();
  std::unordered_map<int64_t, size_t> img_index, cat_index;
  for (size_t i = 0; i < I; ++i) img_index[image_ids[i]] = i;
  for (size_t k = 0; k < K; ++k) cat_index[cat_ids[k]] = k;

  // _prepare: per (category, image), GTs in file order and detections in
  // results order. Detection ids are 1-based positions, as loadRes sets them.
  std::vector<std::vector<std::vector<size_t>>> gts(K, std::vector<std::vector<size_t>>(I));
  std::vector<std::vector<std::vector<size_t>>> dts(K, std::vector<std::vector<size_t>>(I));
  CocoEvalResult result;
  result.images = I;
  for (size_t a = 0; a < gt.annotations.size(); ++a) {
    const auto& g = gt.annotations[a];
    auto ii = img_index.find(g.image_id);
    if (ii == img_index.end()) continue;
    gts[cat_index.at(g.category_id)][ii->second].push_back(a);
    ++result.ground_truth;
  }
  for (size_t d = 0; d < dets.size(); ++d) {
    auto ii = img_index.find(dets[d].image_id);
    auto kk = cat_index.find(dets[d].category_id);
    if (ii == img_index.end() || kk == cat_index.end()) continue;
    dts[kk->second][ii->second].push_back(d);
    ++result.detections;
  }

  const auto iou_thrs = iou_thresholds();
  const auto rec_thrs = recall_thresholds();
  const int max_det = kMaxDets[kM - 1];
  // precision[t][r][k][a][m], recall[t][k][a][m]; -1 where undefined.
  const auto P = [&](int t, int r, size_t k, int a, int m) {
    return (((static_cast<size_t>(t) * kR + r) * K + k) * kA + a) * kM + m;
  };
  const auto Rc = [&](int t, size_t k, int a, int m) { return ((static_cast<size_t>(t) * K + k) * kA + a) * kM + m; };
  std::vector<double> precision(static_cast<size_t>(kT) * kR * K * kA * kM, -1.0);
  std::vector<double> recall(static_cast<size_t>(kT) * K * kA * kM, -1.0);

  for (size_t k = 0; k < K; ++k) {
    // computeIoU per image: detections sorted by score, the first max_det.
    std::vector<std::vector<size_t>> dt_sorted(I);
    std::vector<std::vector<std::vector<double>>> ious(I);  // [d][g], GTs in file order
    for (size_t i = 0; i < I; ++i) {
      auto& ds = dt_sorted[i];
      ds = dts[k][i];
      sort_by_score(ds, dets);
      if (ds.size() > static_cast<size_t>(max_det)) ds.resize(max_det);
      const auto& gs = gts[k][i];
      ious[i].assign(ds.size(), std::vector<double>(gs.size()));
      for (size_t d = 0; d < ds.size(); ++d)
        for (size_t g = 0; g < gs.size(); ++g) {
          const auto& ga = gt.annotations[gs[g]];
          ious[i][d][g] = box_iou(dets[ds[d]].bbox, ga.bbox, ga.iscrowd);
        }
    }
    for (int a = 0; a < kA; ++a) {
      const double lo = kAreaRng[a][0], hi = kAreaRng[a][1];
      // evaluateImg(image, category, area range, max_det).
      std::vector<EvalImg> evals(I);
      for (size_t i = 0; i < I; ++i) {
        const auto& gs = gts[k][i];
        const auto& ds = dt_sorted[i];
        if (gs.empty() && ds.empty()) continue;
        EvalImg& e = evals[i];
        e.valid = true;
        std::vector<int> g_ignore(gs.size());
        for (size_t g = 0; g < gs.size(); ++g) {
          const auto& ga = gt.annotations[gs[g]];
          g_ignore[g] = ga.iscrowd || ga.area < lo || ga.area > hi;
        }
        std::vector<size_t> gtind(gs.size());
        std::iota(gtind.begin(), gtind.end(), 0);
        std::stable_sort(gtind.begin(), gtind.end(), [&](size_t x, size_t y) { return g_ignore[x] < g_ignore[y]; });
        const size_t G = gs.size(), D = ds.size();
        e.gt_ignore.resize(G);
        std::vector<bool> crowd(G);
        std::vector<int64_t> gid(G);
        for (size_t g = 0; g < G; ++g) {
          e.gt_ignore[g] = g_ignore[gtind[g]] != 0;
          crowd[g] = gt.annotations[gs[gtind[g]]].iscrowd;
          gid[g] = gt.annotations[gs[gtind[g]]].id;
        }
        e.dt_scores.resize(D);
        e.dt_matches.assign(D, {});
        e.dt_ignore.assign(D, {});
        for (size_t d = 0; d < D; ++d) e.dt_scores[d] = dets[ds[d]].score;
        if (G > 0 && D > 0) {
          std::vector<int64_t> gtm(G);
          for (int t = 0; t < kT; ++t) {
            std::fill(gtm.begin(), gtm.end(), 0);
            for (size_t d = 0; d < D; ++d) {
              double iou = std::min(iou_thrs[t], 1 - 1e-10);
              long m = -1;
              for (size_t g = 0; g < G; ++g) {
                if (gtm[g] > 0 && !crowd[g]) continue;  // already matched, not a crowd
                if (m > -1 && !e.gt_ignore[m] && e.gt_ignore[g]) break;  // on ignored GTs now
                const double v = ious[i][d][gtind[g]];
                if (v < iou) continue;
                iou = v;
                m = static_cast<long>(g);
              }
              if (m == -1) continue;
              e.dt_ignore[d][t] = e.gt_ignore[m];
              e.dt_matches[d][t] = gid[m];
              gtm[m] = static_cast<int64_t>(ds[d]) + 1;
            }
          }
        }
        for (size_t d = 0; d < D; ++d) {
          const CocoBox& b = dets[ds[d]].bbox;
          const double area = b.w * b.h;
          const bool outside = area < lo || area > hi;
          for (int t = 0; t < kT; ++t)
            e.dt_ignore[d][t] = e.dt_ignore[d][t] || (e.dt_matches[d][t] == 0 && outside);
        }
      }
      // accumulate for each maxDets.
      for (int m = 0; m < kM; ++m) {
        const size_t md = static_cast<size_t>(kMaxDets[m]);
        struct Row {
          double score;
          const EvalImg* e;
          size_t d;
        };
        std::vector<Row> rows;
        size_t npig = 0;
        bool any = false;
        for (size_t i = 0; i < I; ++i) {
          const EvalImg& e = evals[i];
          if (!e.valid) continue;
          any = true;
          for (size_t d = 0; d < std::min(md, e.dt_scores.size()); ++d) rows.push_back({e.dt_scores[d], &e, d});
          for (bool ig : e.gt_ignore) npig += !ig;
        }
        if (!any || npig == 0) continue;
        std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return -x.score < -y.score; });
        const size_t nd = rows.size();
        std::vector<double> rc(nd), pr(nd);
        for (int t = 0; t < kT; ++t) {
          double tp = 0, fp = 0;
          for (size_t j = 0; j < nd; ++j) {
            const bool matched = rows[j].e->dt_matches[rows[j].d][t] != 0;
            const bool ignored = rows[j].e->dt_ignore[rows[j].d][t];
            if (!ignored) (matched ? tp : fp) += 1;
            rc[j] = tp / static_cast<double>(npig);
            pr[j] = tp / (fp + tp + DBL_EPSILON);  // np.spacing(1)
          }
          recall[Rc(t, k, a, m)] = nd ? rc[nd - 1] : 0;
          for (size_t j = nd; j-- > 1;)
            if (pr[j] > pr[j - 1]) pr[j - 1] = pr[j];
          for (int r = 0; r < kR; ++r) {
            // np.searchsorted(rc, thr, 'left'): the first recall >= thr;
            // past the end precision stays 0 (pycocotools' try/except).
            const size_t pi = static_cast<size_t>(std::lower_bound(rc.begin(), rc.end(), rec_thrs[r]) - rc.begin());
            precision[P(t, r, k, a, m)] = pi < nd ? pr[pi] : 0.0;
          }
        }
      }
    }
  }

  // summarize: the mean of the entries that are not -1 (of one category
  // when `k_only` is set).
  const auto ap = [&](int t_only, int a, int m, long k_only = -1) {
    double sum = 0;
    size_t n = 0;
    for (int t = 0; t < kT; ++t) {
      if (t_only >= 0 && t != t_only) continue;
      for (int r = 0; r < kR; ++r)
        for (size_t k = 0; k < K; ++k) {
          if (k_only >= 0 && k != static_cast<size_t>(k_only)) continue;
          const double v = precision[P(t, r, k, a, m)];
          if (v > -1) sum += v, ++n;
        }
    }
    return n ? sum / static_cast<double>(n) : -1.0;
  };
  const auto ar = [&](int a, int m) {
    double sum = 0;
    size_t n = 0;
    for (int t = 0; t < kT; ++t)
      for (size_t k = 0; k < K; ++k) {
        const double v = recall[Rc(t, k, a, m)];
        if (v > -1) sum += v, ++n;
      }
    return n ? sum / static_cast<double>(n) : -1.0;
  };
  // iouThr .5 and .75 are thresholds 0 and 5 (np.where(iouThr == iouThrs)).
  result.stats = {ap(-1, 0, 2), ap(0, 0, 2), ap(5, 0, 2), ap(-1, 1, 2), ap(-1, 2, 2), ap(-1, 3, 2),
                  ar(0, 0),     ar(0, 1),    ar(0, 2),    ar(1, 2),     ar(2, 2),     ar(3, 2)};
  for (size_t k = 0; k < K; ++k) result.ap_per_category[cat_ids[k]] = ap(-1, 0, 2, static_cast<long>(k));
  return result;
}

}  // namespace kiln
