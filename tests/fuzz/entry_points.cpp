#include "tasks/eval_set.hpp"
#include "tests/fuzz/entry_points.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "bundle/bundle.hpp"
#include "bundle/tactics_record.hpp"
#include "checkpoint/hf_config.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/npy.hpp"
#include "image/image.hpp"
#include "kiln/kiln.hpp"
#include "runtime/engine_impl.hpp"
#include "tasks/runtime_config.hpp"

namespace kiln::fuzz {

namespace {

// Reads every byte a parser handed out, so an out-of-bounds view is an
// AddressSanitizer report here rather than a silent wrong answer later.
volatile uint8_t g_sink = 0;
void touch(const uint8_t* p, size_t n) {
  uint8_t x = 0;
  for (size_t i = 0; i < n; ++i) x ^= p[i];
  g_sink = g_sink ^ x;
}

// A broken invariant of what a parser returned: not a kiln::Error (which the
// fuzzers treat as a clean rejection) but an abort, so it is reported.
void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

std::string as_text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// With the header digest recomputed, a mutated header gets past the digest
// check to the section table checks behind it (the digest is what stops a
// corrupt file; here we want to test what comes after it).
std::vector<uint8_t> with_fixed_header_digest(const uint8_t* data, size_t size) {
  std::vector<uint8_t> b(data, data + size);
  if (size < kBundlePrefixSize) return b;
  uint64_t h = 0;
  for (int i = 7; i >= 0; --i) h = (h << 8) | b[8 + i];
  if (h > size || kBundlePrefixSize + h + kBundleHeaderDigestSize > size) return b;
  const auto d = sha256(b.data(), kBundlePrefixSize + h);
  std::memcpy(b.data() + kBundlePrefixSize + h, d.data(), d.size());
  return b;
}

// Small enough to run on every fuzz input: a loaded bundle is meant to be
// run, so a graph the loader accepts but the kernels cannot run safely is a
// loader bug. Bigger graphs are only loaded (their cost would hide the rest).
constexpr int64_t kRunMaxElements = int64_t{1} << 14;  // per value
constexpr size_t kRunMaxNodes = 32;

bool small_enough_to_run(const Graph& g) {
  if (g.nodes.size() > kRunMaxNodes) return false;
  for (const Value& v : g.values) {
    int64_t n = 1;
    for (int64_t d : v.shape)
      if (__builtin_mul_overflow(n, d, &n) || n > kRunMaxElements) return false;
  }
  // Window ops cost elements x kernel area; bound the kernel too.
  for (const Node& n : g.nodes)
    for (int v : n.inputs)
      if (g.values[v].constant && g.values[v].constant->nbytes() > (size_t{1} << 14)) return false;
  return true;
}

void load_engine_cpu(const uint8_t* data, size_t size, const std::string& name) {
  auto engine = Engine::load_from_memory(data, size, LoadOptions{"cpu", nullptr}, name);
  // What a caller reads right after loading.
  for (const auto& l : engine->labels()) touch(reinterpret_cast<const uint8_t*>(l.data()), l.size());
  if (!small_enough_to_run(engine->impl().graph)) return;
  std::vector<Tensor> inputs;
  for (const auto& t : engine->inputs())
    inputs.push_back({t.name, t.shape, std::vector<float>(static_cast<size_t>(shape_numel(t.shape)), 0.5f)});
  for (const Tensor& out : engine->create_context()->run(inputs))
    check(out.data.size() == static_cast<size_t>(shape_numel(out.shape)), "engine output size disagrees with its shape");
}

}  // namespace

void safetensors(const uint8_t* data, size_t size) {
  SafetensorsFile f = parse_safetensors(Blob::copy_of(data, size), "fuzz.safetensors");
  for (const auto& [name, t] : f.tensors) {
    touch(t.blob.data, t.blob.size);
    check(t.blob.size == t.nbytes(), "safetensors tensor blob size disagrees with its shape");
    // Conversion reads the blob as typed values (alignment, fp8/bf16 paths; e5m2 has no conversion).
    if (dtype_is_float(t.dtype) && t.dtype != DType::F8E5M2 && t.blob.size <= (size_t{1} << 20)) t.to_f32();
  }
}

void safetensors_index(const uint8_t* data, size_t size) {
  for (const auto& [tensor, file] : parse_safetensors_index(data, size, "fuzz.index.json"))
    touch(reinterpret_cast<const uint8_t*>(file.data()), file.size());
}

void bundle(const uint8_t* data, size_t size) {
  // As stored: every digest checked.
  try {
    Bundle b = Bundle::from_bytes(Blob::copy_of(data, size), "fuzz.bundle");
    for (const auto& name : b.section_names()) touch(b.section(name).data, b.section(name).size);
  } catch (const Error&) {
  }
  // With a valid header digest, through the whole engine load.
  const std::vector<uint8_t> fixed = with_fixed_header_digest(data, size);
  load_engine_cpu(fixed.data(), fixed.size(), "fuzz.bundle");
}

std::vector<uint8_t> join_sections(const std::vector<std::vector<uint8_t>>& parts) {
  std::vector<uint8_t> out;
  const std::string_view sep(kSectionSeparator);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out.insert(out.end(), sep.begin(), sep.end());
    out.insert(out.end(), parts[i].begin(), parts[i].end());
  }
  return out;
}

void bundle_sections(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size), sep(kSectionSeparator);
  BundleWriter w(BundleInfo{kBundleFormat, KILN_VERSION, "fuzz", "classification", "cpu"});
  size_t pos = 0;
  for (const char* name : kSectionOrder) {
    if (pos > all.size()) break;
    size_t end = all.find(sep, pos);
    if (end == std::string_view::npos) end = all.size();
    w.add_section(name, std::string(all.substr(pos, end - pos)));
    pos = end + sep.size();
  }
  const std::vector<uint8_t> bytes = w.to_bytes();
  load_engine_cpu(bytes.data(), bytes.size(), "fuzz.bundle");
}

void tactics_json(const uint8_t* data, size_t size) {
  const nlohmann::json t = parse_tactics_record(as_text(data, size), "fuzz tactics.json");
  // What kiln inspect --plan reads of a record that passed.
  if (t.contains("batches"))
    for (const auto& [b, v] : t["batches"].items())
      if (v.contains("plan") && v["plan"].contains("steps"))
        for (const auto& st : v["plan"]["steps"]) {
          const std::string name = st[0].get<std::string>() + st[1].get<std::string>();
          touch(reinterpret_cast<const uint8_t*>(name.data()), name.size());
        }
  // And of its side lane: each run's step indices, fork and join (indices into steps).
  if (t.contains("batches"))
    for (const auto& [b, v] : t["batches"].items())
      if (v.contains("plan") && v["plan"].contains("side_lane"))
        for (const auto& r : v["plan"]["side_lane"]) {
          const size_t n = v["plan"].value("steps", nlohmann::json::array()).size();
          for (const auto& k : r["steps"]) check(k.get<size_t>() < n, "a side lane step index past the steps");
          check(r["fork"].get<size_t>() < r["join"].get<size_t>() && r["join"].get<size_t>() <= n,
                "a side lane fork after its join, or a join past the steps");
        }
}

void hf_config(const uint8_t* data, size_t size) {
  TimmConfig c = parse_timm_config_bytes(data, size, "fuzz config.json");
  for (const auto& l : c.label_names) touch(reinterpret_cast<const uint8_t*>(l.data()), l.size());
}

void runtime_json(const uint8_t* data, size_t size) {
  const std::string text = as_text(data, size);
  validate_runtime_json(text, "fuzz runtime.json");
  // What Classifier (or Detector) does with a runtime.json that passed validation.
  const nlohmann::json j = nlohmann::json::parse(text);
  if (j.at("task") == "detection") {
    const DetectionRuntime r = parse_detection_runtime(j, "fuzz runtime.json");
    g_sink = g_sink ^ static_cast<uint8_t>(r.num_classes + r.num_queries);
    return;
  }
  ClassificationRuntime r = parse_classification_runtime(j, "fuzz runtime.json");
  g_sink = g_sink ^ static_cast<uint8_t>(r.num_classes);
}

void labels_json(const uint8_t* data, size_t size) {
  for (const auto& l : parse_labels(as_text(data, size), "fuzz labels.json"))
    touch(reinterpret_cast<const uint8_t*>(l.data()), l.size());
}

void eval_labels(const uint8_t* data, size_t size) {
  const EvalSet set = parse_label_file(as_text(data, size), "fuzz val.txt", "/images", 1000);
  for (const auto& item : set.items) {
    touch(reinterpret_cast<const uint8_t*>(item.path.data()), item.path.size());
    check(item.class_id >= 0 && item.class_id < 1000, "label file class id outside [0, classes)");
  }
}

void npy(const uint8_t* data, size_t size) {
  HostTensor t = read_npy_bytes(data, size, "fuzz.npy");
  touch(t.blob.data, t.blob.size);
  check(t.blob.size == t.nbytes(), "npy blob size disagrees with its shape");
}

void image(const uint8_t* data, size_t size) {
  ImageU8 img = decode_image_bytes(data, size, "fuzz image");
  check(img.width > 0 && img.height > 0 && img.rgb.size() == static_cast<size_t>(img.width) * img.height * 3,
        "decoded image size disagrees with its dimensions");
  touch(img.rgb.data(), img.rgb.size());
}

const std::vector<Target>& targets() {
  static const std::vector<Target> kTargets = {
      {"safetensors", safetensors}, {"safetensors_index", safetensors_index},
      {"bundle", bundle},           {"bundle_sections", bundle_sections},
      {"hf_config", hf_config},     {"runtime_json", runtime_json},
      {"labels_json", labels_json}, {"eval_labels", eval_labels}, {"npy", npy},
      {"jpeg", image},              {"png", image},
      {"tactics_json", tactics_json},
  };
  return kTargets;
}

}  // namespace kiln::fuzz
