#include "bundle/tactics_record.hpp"

#include "core/error.hpp"

namespace kiln {

using nlohmann::json;

namespace {

// The record's type rules, each naming the key path on failure.
struct Checker {
  const std::string& source;
  [[noreturn]] void bad(const std::string& path, const char* want) const {
    fail_input(source, ": '", path, "' must be ", want);
  }
  const json* optional(const json& j, const char* key) const {
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  }
  void string_at(const json& j, const char* key, const std::string& path) const {
    if (const json* v = optional(j, key); v && !v->is_string()) bad(path + "." + key, "a string");
  }
  void count_at(const json& j, const char* key, const std::string& path) const {
    if (const json* v = optional(j, key); v && !(v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0)))
      bad(path + "." + key, "a non-negative integer");
  }
  void bool_at(const json& j, const char* key, const std::string& path) const {
    if (const json* v = optional(j, key); v && !v->is_boolean()) bad(path + "." + key, "true or false");
  }
  void layers(const json& l, const std::string& path) const {
    if (!l.is_object()) bad(path, "an object of layer name -> {tactic, time_us}");
    for (const auto& [name, v] : l.items()) {
      const std::string at = path + "." + name;
      if (!v.is_object()) bad(at, "an object");
      if (!v.contains("tactic")) bad(at + ".tactic", "present");
      string_at(v, "tactic", at);
      if (const json* t = optional(v, "time_us"); t && !t->is_number()) bad(at + ".time_us", "a number");
    }
  }
  void plan(const json& p, const std::string& path) const {
    if (!p.is_object()) bad(path, "an object");
    // The view blocks run as window convs; true/false in bundles before per-block choices.
    if (const json* w = optional(p, "window_conv")) {
      if (!w->is_boolean() && !w->is_array()) bad(path + ".window_conv", "a list of view block names (or true/false)");
      for (size_t i = 0; w->is_array() && i < w->size(); ++i)
        if (!(*w)[i].is_string() || (*w)[i].get<std::string>().empty())
          bad(path + ".window_conv[" + std::to_string(i) + "]", "a view block name (a non-empty string)");
    }
    bool_at(p, "channel_views", path);
    count_at(p, "arena_bytes", path);
    count_at(p, "workspace_bytes", path);
    if (const json* s = optional(p, "steps")) {
      if (!s->is_array()) bad(path + ".steps", "a list of [node, kernel]");
      for (size_t i = 0; i < s->size(); ++i) {
        const json& st = (*s)[i];
        if (!st.is_array() || st.size() != 2 || !st[0].is_string() || !st[1].is_string())
          bad(path + ".steps[" + std::to_string(i) + "]", "[node name, kernel or tactic] (two strings)");
      }
    }
    // The side lane's runs: {steps: [step indices], fork, join}, the steps
    // and the fork before the join, the join at most the step count.
    if (const json* sl = optional(p, "side_lane")) {
      if (!sl->is_array()) bad(path + ".side_lane", "a list of {steps, fork, join}");
      const json* st = optional(p, "steps");
      const size_t n = st && st->is_array() ? st->size() : 0;
      for (size_t i = 0; i < sl->size(); ++i) {
        const json& r = (*sl)[i];
        const std::string at = path + ".side_lane[" + std::to_string(i) + "]";
        auto index = [&](const json* v, size_t limit) {
          return v && v->is_number_unsigned() && v->get<uint64_t>() <= limit;
        };
        if (!r.is_object()) bad(at, "an object {steps, fork, join}");
        const json *fork = optional(r, "fork"), *join = optional(r, "join"), *steps = optional(r, "steps");
        if (!index(join, n)) bad(at + ".join", "a step index (at most the step count)");
        if (!index(fork, n) || fork->get<uint64_t>() >= join->get<uint64_t>()) bad(at + ".fork", "a step index before the join");
        if (!steps || !steps->is_array() || steps->empty()) bad(at + ".steps", "a non-empty list of step indices");
        for (size_t k = 0; k < steps->size(); ++k)
          if (const json& v = (*steps)[k]; !v.is_number_unsigned() || v.get<uint64_t>() >= n)
            bad(at + ".steps[" + std::to_string(k) + "]", "a step index (below the step count)");
      }
    }
    for (const char* key : {"late_side_fork", "chain_side_fork", "weight_prefetch", "prefetch_evict_last"})
      if (const json* v = optional(p, key); v && !v->is_boolean()) bad(path + "." + key, "true or false");
    // Nodes fused by name (session 28): the post-norms run as small_gemm_norm,
    // the muls written by their concat's launch.
    for (const char* key : {"linear_norm", "concat_mask"})
      if (const json* l = optional(p, key)) {
        if (!l->is_array()) bad(path + "." + key, "a list of node names");
        for (size_t i = 0; i < l->size(); ++i)
          if (!(*l)[i].is_string() || (*l)[i].get<std::string>().empty())
            bad(path + "." + key + "[" + std::to_string(i) + "]", "a node name (a non-empty string)");
      }
    if (const json* v = optional(p, "values")) {
      if (!v->is_object()) bad(path + ".values", "an object of value name -> [arena offset, view offset]");
      for (const auto& [name, off] : v->items())
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_integer() || !off[1].is_number_integer())
          bad(path + ".values." + name, "[arena offset, view offset] (two integers)");
    }
  }
};

}  // namespace

json parse_tactics_record(const std::string& text, const std::string& source) {
  json t = json::parse(text, nullptr, false);
  if (t.is_discarded() || !t.is_object()) fail_input(source, ": not a JSON object");
  const Checker c{source};
  if (const json* k = c.optional(t, "key")) {
    if (!k->is_object()) c.bad("key", "an object {gpu, driver, cudnn, cublaslt}");
    c.string_at(*k, "gpu", "key");
    for (const char* f : {"driver", "cudnn", "cublaslt"}) c.count_at(*k, f, "key");  // versions as integers
  }
  if (const json* o = c.optional(t, "opt_level"); o && !o->is_number_integer()) c.bad("opt_level", "an integer");
  if (const json* l = c.optional(t, "layers")) c.layers(*l, "layers");
  if (const json* b = c.optional(t, "batches")) {
    if (!b->is_object()) c.bad("batches", "an object of batch size -> {layers, plan}");
    for (const auto& [batch, v] : b->items()) {
      const std::string at = "batches." + batch;
      if (batch.empty() || batch.size() > 9 || batch.find_first_not_of("0123456789") != std::string::npos || batch[0] == '0')
        c.bad(at, "keyed by a positive batch size");
      if (!v.is_object()) c.bad(at, "an object {layers, plan}");
      if (const json* l = c.optional(v, "layers")) c.layers(*l, at + ".layers");
      if (const json* p = c.optional(v, "plan")) c.plan(*p, at + ".plan");
    }
  }
  return t;
}

}  // namespace kiln
