#include "quant/recipe.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "core/error.hpp"
#include "ir/node_select.hpp"
#include "quant/strict_json.hpp"

namespace kiln::quant {

using nlohmann::json;

const char* calib_method_name(CalibMethod m) {
  switch (m) {
    case CalibMethod::Max: return "max";
    case CalibMethod::Percentile: return "percentile";
    case CalibMethod::Entropy: return "entropy";
    case CalibMethod::Mse: return "mse";
    default: fail_runtime("calibration method ", static_cast<int>(m), " has no name");
  }
}

namespace {
std::optional<CalibMethod> lookup_calib_method(const std::string& name) {
  for (CalibMethod m : {CalibMethod::Max, CalibMethod::Percentile, CalibMethod::Entropy, CalibMethod::Mse})
    if (name == calib_method_name(m)) return m;
  return std::nullopt;
}
}  // namespace

CalibMethod calib_method_from_name(const std::string& name, const std::string& where) {
  if (const auto m = lookup_calib_method(name)) return *m;
  fail_usage(where, ": calibration method '", name, "' (use max, percentile, entropy or mse)");
}

DType precision_from_name(const std::string& name, const std::string& where) {
  if (name == "fp8") return DType::F8E4M3;
  if (name == "int8") return DType::I8;
  fail_usage(where, ": precision '", name, "' (use fp8 or int8)");
}

const char* precision_name(DType precision) {
  if (precision == DType::F8E4M3) return "fp8";
  if (precision == DType::I8) return "int8";
  fail_usage("recipe precision ", dtype_name(precision), " (recipes quantize to fp8 e4m3 or int8)");
}

namespace {

constexpr int64_t kMaxSmallChannels = int64_t{1} << 20;

// A part is a plain name ("layer2", "blocks.3"); globs belong in include/exclude.
bool is_part_name(const std::string& s) {
  if (s.empty() || s.front() == '.' || s.back() == '.' || s.find("..") != std::string::npos) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'; });
}

std::string part_body(const std::string& part) { return part.rfind("no-", 0) == 0 ? part.substr(3) : part; }

void check_part(const std::string& part, const StrictObject& o) {
  if (!is_part_name(part_body(part)))
    o.fail("parts", "holds '" + part + "', not a part name (all, stem, classifier, head, a name prefix such as layer2; globs go under include/exclude)");
}

void check_globs(const StrictObject& o, const std::string& key, const std::vector<std::string>& globs) {
  for (const auto& g : globs)
    if (g.empty()) o.fail(key, "holds an empty pattern");
}

}  // namespace

Recipe parse_recipe(const std::string& text, const std::string& source) {
  const json j = parse_json_text(text, source);
  const StrictObject o(j, source, "", {"format", "precision"},
                       {"weights", "activations", "calibration", "parts", "include", "exclude", "defaults", "residuals"});
  if (o.integer("format") != 1) o.fail("format", "must be 1 (the only recipe format so far)");
  Recipe r;
  const std::string precision = o.string("precision");
  if (precision != "fp8" && precision != "int8") o.fail("precision", "must be \"fp8\" or \"int8\", not \"" + precision + "\"");
  r.precision = precision == "fp8" ? DType::F8E4M3 : DType::I8;
  if (o.has("weights") && (r.weight_scales = o.string("weights")) != "per_channel_amax")
    o.fail("weights", "must be \"per_channel_amax\" (the only weight scale rule so far)");
  if (o.has("activations") && (r.activation_scales = o.string("activations")) != "static_per_tensor")
    o.fail("activations", "must be \"static_per_tensor\" (the only activation scale rule so far)");
  if (o.has("residuals")) {
    const std::string res = o.string("residuals");
    if (res != "8bit" && res != "wide") o.fail("residuals", "must be \"8bit\" or \"wide\", not \"" + res + "\"");
    r.residuals_8bit = res == "8bit";
  }
  if (o.has("calibration")) r.calibration = calib_settings_from_json(o.at("calibration"), source, "calibration");
  if (o.has("parts")) {
    r.parts = o.strings("parts");
    for (const auto& p : r.parts) check_part(p, o);
  }
  if (o.has("include")) check_globs(o, "include", r.include = o.strings("include"));
  if (o.has("exclude")) check_globs(o, "exclude", r.exclude = o.strings("exclude"));
  if (o.has("defaults")) {
    const StrictObject d = o.object("defaults", {}, {"stem", "classifier", "depthwise", "max_small_channels", "pooled"});
    if (d.has("stem")) r.defaults.stem = d.boolean("stem");
    if (d.has("classifier")) r.defaults.classifier = d.boolean("classifier");
    if (d.has("depthwise")) r.defaults.depthwise = d.boolean("depthwise");
    if (d.has("pooled")) r.defaults.pooled = d.boolean("pooled");
    if (d.has("max_small_channels")) {
      r.defaults.max_small_channels = d.integer("max_small_channels");
      if (r.defaults.max_small_channels < 0 || r.defaults.max_small_channels > kMaxSmallChannels)
        d.fail("max_small_channels", "must lie in [0, 1048576] (0 turns the rule off)");
    }
  }
  return r;
}

Recipe read_recipe(const std::string& path) { return parse_recipe(read_text_file(path), path); }

json calib_settings_to_json(const CalibSettings& s) {
  json j = {{"method", calib_method_name(s.method)}};
  if (s.method == CalibMethod::Percentile) j["percentile"] = s.percentile;
  return j;
}

CalibSettings calib_settings_from_json(const json& j, const std::string& source, const std::string& key) {
  const StrictObject c(j, source, key, {"method"}, {"percentile"});
  CalibSettings s;
  const std::string m = c.string("method");
  const auto method = lookup_calib_method(m);
  if (!method) c.fail("method", "must be max, percentile, entropy or mse, not \"" + m + "\"");
  s.method = *method;
  if (c.has("percentile")) {
    if (s.method != CalibMethod::Percentile) c.fail("percentile", "is only read with method percentile");
    s.percentile = c.number("percentile");
    if (!(s.percentile > 0 && s.percentile <= 100)) c.fail("percentile", "must lie in (0, 100]");
  }
  return s;
}

std::string recipe_to_json(const Recipe& r) {
  const json calibration = calib_settings_to_json(r.calibration);
  const json j = {{"format", 1},
                  {"precision", precision_name(r.precision)},
                  {"weights", r.weight_scales},
                  {"activations", r.activation_scales},
                  {"calibration", calibration},
                  {"parts", r.parts},
                  {"include", r.include},
                  {"exclude", r.exclude},
                  {"residuals", r.residuals_8bit ? "8bit" : "wide"},
                  {"defaults",
                   {{"stem", r.defaults.stem},
                    {"classifier", r.defaults.classifier},
                    {"depthwise", r.defaults.depthwise},
                    {"max_small_channels", r.defaults.max_small_channels},
                    {"pooled", r.defaults.pooled}}}};
  return j.dump(2) + "\n";
}

// ---- selection ----

bool is_quantization_candidate(const Graph& g, const Node& n) {
  return (n.op == Op::Conv2d || n.op == Op::Linear) && n.inputs.size() >= 2 && g.is_constant(n.inputs[1]);
}

namespace {

// Built-in part rules for the timm CNN families (docs/quantization.md):
// ResNet / Res2Net: stem conv1 (deep stem conv1.0/.3/.6), stages layer1..4,
// classifier fc. EfficientNet: stem conv_stem, stages blocks.0..6, head
// conv_head, classifier classifier. Structure backs the names up: a conv
// reading a graph input is stem, a linear producing a graph output is the
// classifier, so other families get both without a table.
const std::vector<std::string> kStemNames = {"conv1", "conv1.*", "conv_stem", "stem", "stem.*"};
const std::vector<std::string> kClassifierNames = {"fc", "classifier", "head.fc"};
const std::vector<std::string> kHeadNames = {"conv_head"};

bool reads_graph_input(const Graph& g, const Node& n) {
  return std::find(g.inputs.begin(), g.inputs.end(), n.inputs[0]) != g.inputs.end();
}

bool is_stem(const Graph& g, const Node& n) {
  return n.op == Op::Conv2d && (node_matches(n, kStemNames) || reads_graph_input(g, n));
}

bool is_classifier(const Graph& g, const Node& n) {
  return n.op == Op::Linear && (node_matches(n, kClassifierNames) || g.is_graph_output(n.outputs[0]));
}

int64_t groups_of(const Node& n) { return n.op == Op::Conv2d ? n.attr_int("groups", 1) : 1; }

bool is_depthwise(const Graph& g, const Node& n) {
  if (n.op != Op::Conv2d) return false;
  const int64_t groups = groups_of(n);
  return groups > 1 && groups == g.values[n.inputs[0]].shape.at(1);
}

// The node producing value v, looking through element-wise activations (a
// separate SiLU between SE's reduce and expand); nullptr for an input.
const Node* producer_through_activations(const Graph& g, int v) {
  for (int hops = 0; hops < 4; ++hops) {
    const int p = g.values[v].producer;
    if (p < 0) return nullptr;
    const Node& n = g.nodes[p];
    if (n.op != Op::Activation) return &n;
    v = n.inputs[0];
  }
  return nullptr;
}

bool reads_global_pool(const Graph& g, const Node& n) {
  const Node* p = producer_through_activations(g, n.inputs[0]);
  return p && p->op == Op::GlobalAvgPool;
}

// Squeeze-excitation's convs: the reduce reads a global pool, the expand the
// reduce. (Not every conv on a 1x1 map: a small-input model's late 3x3 convs
// see 1x1 maps too, and are layers like any other.)
bool is_pooled(const Graph& g, const Node& n) {
  if (n.op != Op::Conv2d) return false;
  if (reads_global_pool(g, n)) return true;
  const Node* p = producer_through_activations(g, n.inputs[0]);
  return p && p->op == Op::Conv2d && reads_global_pool(g, *p);
}

// Input and output channels: conv weight [O, C/g, kh, kw], linear weight [M, K].
std::pair<int64_t, int64_t> channels_of(const Graph& g, const Node& n) {
  const Shape& w = g.values[n.inputs[1]].shape;
  return {w.at(1) * groups_of(n), w.at(0)};
}

bool in_prefix(const std::string& name, const std::string& prefix) {
  return name == prefix || (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.');
}

// Name prefixes a user is likely to mean: "layer2", "blocks.3" (the first
// name component, and for "blocks" the stage index after it).
std::string prefix_suggestions(const Graph& g, const std::vector<int>& candidates) {
  std::set<std::string> seen;
  std::vector<std::string> order;
  for (int i : candidates) {
    const std::string& name = g.nodes[i].name;
    const size_t dot = name.find('.');
    if (dot == std::string::npos) continue;
    std::string p = name.substr(0, dot);
    if (p == "blocks") {
      const size_t dot2 = name.find('.', dot + 1);
      p = name.substr(0, dot2);
    }
    if (seen.insert(p).second) order.push_back(p);
  }
  std::string s;
  for (size_t i = 0; i < order.size() && i < 12; ++i) s += (s.empty() ? "" : ", ") + order[i];
  return s.empty() ? "none" : s;
}

std::vector<char> part_members(const Graph& g, const std::string& part, const PartTable& extra, const std::vector<int>& candidates) {
  std::vector<char> on(g.nodes.size(), 0);
  const auto table = extra.find(part);
  for (int i : candidates) {
    const Node& n = g.nodes[i];
    bool in;
    if (part == "all") in = true;
    else if (table != extra.end()) in = node_matches(n, table->second);
    else if (part == "stem") in = is_stem(g, n);
    else if (part == "classifier") in = is_classifier(g, n);
    else if (part == "head") in = node_matches(n, kHeadNames);
    else in = in_prefix(n.name, part);
    on[i] = in;
  }
  if (std::none_of(on.begin(), on.end(), [](char c) { return c; })) {
    std::string named;
    for (const auto& [k, v] : extra) named += ", " + k;
    fail_usage("recipe part '", part, "' names no conv or linear layer of this graph (parts: all, stem, classifier, head", named,
               ", or a name prefix: ", prefix_suggestions(g, candidates), ")");
  }
  return on;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "; ") + x;
  return s;
}

std::vector<std::string> default_reasons(const Graph& g, const Node& n, const DefaultExclusions& d) {
  std::vector<std::string> why;
  if (d.stem && is_stem(g, n)) why.push_back("default exclusion: stem (defaults.stem)");
  if (d.classifier && is_classifier(g, n)) why.push_back("default exclusion: classifier (defaults.classifier)");
  if (d.depthwise && is_depthwise(g, n)) why.push_back("default exclusion: depthwise conv (defaults.depthwise)");
  if (d.pooled && is_pooled(g, n)) why.push_back("default exclusion: squeeze-excitation conv after a global pool (defaults.pooled)");
  if (d.max_small_channels > 0) {
    const auto [in, out] = channels_of(g, n);
    if (in <= d.max_small_channels)
      why.push_back(cat("default exclusion: ", in, " input channels <= ", d.max_small_channels, " (defaults.max_small_channels)"));
    if (out <= d.max_small_channels)
      why.push_back(cat("default exclusion: ", out, " output channels <= ", d.max_small_channels, " (defaults.max_small_channels)"));
  }
  return why;
}

// Each pattern must match a conv or linear: one that matches nothing, or
// only layers that are never quantized, is a typo or a misunderstanding.
void check_patterns(const Graph& g, const std::vector<std::string>& patterns, const std::vector<int>& candidates,
                    const std::string& what) {
  if (patterns.empty()) return;
  select_nodes(g, patterns, what);  // names the first pattern that matches no node at all
  for (const auto& p : patterns)
    if (std::none_of(candidates.begin(), candidates.end(), [&](int i) { return node_matches(g.nodes[i], {p}); }))
      fail_usage(what, " '", p, "' matches only layers that are never quantized (conv2d and linear with constant weights are)");
}

}  // namespace

Selection select_quantized(const Graph& g, const Recipe& r, const PartTable& extra_parts) {
  precision_name(r.precision);  // refuses a precision a recipe cannot have
  std::vector<int> candidates;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (is_quantization_candidate(g, g.nodes[i])) candidates.push_back(static_cast<int>(i));

  const std::string unselected = "not selected: no part or include pattern of the recipe names it";
  std::vector<char> on(g.nodes.size(), 0);
  std::vector<std::string> reason(g.nodes.size(), unselected);
  for (const auto& part : r.parts) {
    const bool remove = part.rfind("no-", 0) == 0;
    const std::string body = part_body(part);
    if (!is_part_name(body)) fail_usage("recipe part '", part, "' is not a part name (globs go under include/exclude)");
    const std::vector<char> members = part_members(g, body, extra_parts, candidates);
    for (int i : candidates)
      if (members[i]) {
        on[i] = !remove;
        if (remove) reason[i] = "removed by part '" + part + "'";
      }
  }
  check_patterns(g, r.include, candidates, "recipe include pattern");
  check_patterns(g, r.exclude, candidates, "recipe exclude pattern");
  for (int i : candidates)
    if (node_matches(g.nodes[i], r.include)) on[i] = 1;
  for (int i : candidates)
    for (const auto& p : r.exclude)
      if (on[i] && node_matches(g.nodes[i], {p})) on[i] = 0, reason[i] = "removed by exclude pattern '" + p + "'";

  Selection s;
  for (int i : candidates) {
    if (on[i]) {
      const std::vector<std::string> why = default_reasons(g, g.nodes[i], r.defaults);
      if (why.empty()) {
        s.quantized.push_back(i);
        continue;
      }
      reason[i] = join(why);
    }
    s.excluded.push_back({i, reason[i]});
  }
  return s;
}

}  // namespace kiln::quant
