// Writes the generated part of the fuzz seed corpus (tests/fuzz/corpus/):
// tiny but complete bundles built in code, the real demo bundle's sections
// with its weights left out, and safetensors/npy files trimmed from the real
// fixtures. Copied seeds (configs, images, small .npy) come from
// tools/fuzz.sh --seeds. Run by hand; the output is committed.
//   fuzz_make_seeds CORPUS_DIR DEMO_BUNDLE FIXTURES_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bundle/bundle.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/error.hpp"
#include "core/file.hpp"
#include "core/npy.hpp"
#include "ir/serialize.hpp"
#include "tasks/runtime_config.hpp"
#include "tests/fuzz/entry_points.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace kiln;

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

void save(const fs::path& p, const std::vector<uint8_t>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  std::cout << p.string() << ": " << b.size() << " bytes\n";
}

HostTensor ramp(DType t, const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.125f;
  return HostTensor::from_f32_as(t, shape, v);
}

// conv 3->4 (3x3, stride 2, pad 1, fused relu) -> global pool -> flatten -> linear 4->3:
// every section a classification bundle needs, in a few hundred bytes of weights.
SerializedGraph tiny_graph(DType t) {
  Graph g;
  const int x = g.add_input("pixel_values", t, {1, 3, 8, 8});
  const int w = g.add_constant("stem.conv.weight", ramp(t, {4, 3, 3, 3}));
  const int b = g.add_constant("stem.conv.bias", ramp(t, {4}));
  const int c = g.add_node(Op::Conv2d, "stem.conv", {x, w, b},
                           {{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                            {"activation", std::string("relu")}});
  const int p = g.add_node(Op::GlobalAvgPool, "head.global_pool", {c});
  const int f = g.add_node(Op::Flatten, "head.flatten", {p});
  const int fw = g.add_constant("head.fc.weight", ramp(t, {3, 4}));
  const int fb = g.add_constant("head.fc.bias", ramp(t, {3}));
  g.mark_output(g.add_node(Op::Linear, "head.fc", {f, fw, fb}));
  g.values[g.outputs[0]].name = "logits";
  return serialize_graph(g);
}

std::string tiny_runtime() {
  ClassificationRuntime r;
  r.num_classes = 3;
  r.preprocess.height = r.preprocess.width = 8;
  r.preprocess.mean = {0.5f, 0.5f, 0.5f};
  r.preprocess.std = {0.25f, 0.25f, 0.25f};
  return to_json(r).dump(1);
}

std::vector<std::vector<uint8_t>> tiny_sections(DType t) {
  SerializedGraph sg = tiny_graph(t);
  const json prov = {{"checkpoint", {{"id", "fuzz/tiny"}, {"revision", ""}}},
                     {"build", {{"precision", dtype_name(t)}, {"backend", "cpu"}, {"batch", 1}, {"opt_level", 3}}}};
  return {bytes_of(sg.graph_json), sg.weights, bytes_of(tiny_runtime()), bytes_of(json{"zero", "one", "two"}.dump()),
          bytes_of(prov.dump(1))};
}

std::vector<uint8_t> as_bundle(const std::vector<std::vector<uint8_t>>& parts) {
  BundleWriter w(BundleInfo{kBundleFormat, KILN_VERSION, "fuzz", "classification", "cpu"});
  for (size_t i = 0; i < parts.size(); ++i) w.add_section(fuzz::kSectionOrder[i], parts[i]);
  return w.to_bytes();
}

// Keeps a real checkpoint's tensor names and dtypes but at most `keep`
// elements of each (shape [n]), so the seed has a real header in a few KB.
std::vector<uint8_t> trimmed_safetensors(const fs::path& path, size_t max_tensors, int64_t keep) {
  SafetensorsFile f = read_safetensors(path);
  json header = json::object();
  if (!f.metadata.empty()) header["__metadata__"] = f.metadata;
  std::vector<uint8_t> data;
  size_t n = 0;
  for (const auto& [name, t] : f.tensors) {
    if (n++ == max_tensors) break;
    const int64_t count = std::min<int64_t>(keep, t.numel());
    const size_t nbytes = static_cast<size_t>(count) * dtype_size(t.dtype);
    header[name] = {{"dtype", dtype_safetensors_name(t.dtype)},
                    {"shape", Shape{count}},
                    {"data_offsets", {data.size(), data.size() + nbytes}}};
    data.insert(data.end(), t.blob.data, t.blob.data + nbytes);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // aligned data, as writers do
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// One tensor of every dtype the reader knows.
std::vector<uint8_t> every_dtype_safetensors() {
  json header = {{"__metadata__", {{"format", "pt"}}}};
  std::vector<uint8_t> data;
  const std::pair<const char*, size_t> kinds[] = {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1},
                                                  {"F8_E5M2", 1}, {"I32", 4}, {"I64", 8}, {"U8", 1}};
  for (const auto& [dt, size] : kinds) {
    const size_t nbytes = 2 * 3 * size;
    header[std::string("t.") + dt] = {{"dtype", dt}, {"shape", {2, 3}}, {"data_offsets", {data.size(), data.size() + nbytes}}};
    for (size_t i = 0; i < nbytes; ++i) data.push_back(static_cast<uint8_t>(i * 37 + 11));
  }
  header["t.empty"] = {{"dtype", "F32"}, {"shape", {0, 4}}, {"data_offsets", {data.size(), data.size()}}};
  header["t.scalar"] = {{"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {data.size(), data.size() + 4}}};
  data.insert(data.end(), {0, 0, 128, 63});
  std::string text = header.dump();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR DEMO_BUNDLE FIXTURES_DIR\n", argv[0]);
    return 1;
  }
  const fs::path out = argv[1], demo = argv[2], fixtures = argv[3];
  try {
    for (DType t : {DType::F32, DType::F16}) {  // no .bundle suffix: .gitignore drops *.bundle
      const auto parts = tiny_sections(t);
      const std::string tag = std::string("tiny_") + dtype_name(t);
      save(out / "bundle_sections" / tag, fuzz::join_sections(parts));
      save(out / "bundle" / tag, as_bundle(parts));
      fuzz::bundle(as_bundle(parts).data(), as_bundle(parts).size());  // must load cleanly
      fuzz::bundle_sections(fuzz::join_sections(parts).data(), fuzz::join_sections(parts).size());
    }
    save(out / "runtime_json" / "tiny.json", bytes_of(tiny_runtime()));

    // The real demo bundle: every JSON section as built, weights left out.
    const Bundle b = Bundle::open(demo);
    std::vector<std::vector<uint8_t>> parts;
    for (const char* name : fuzz::kSectionOrder) {
      const Blob s = b.section(name);
      parts.emplace_back(std::string(name) == "weights.bin" ? std::vector<uint8_t>{}
                                                             : std::vector<uint8_t>(s.data, s.data + s.size));
    }
    save(out / "bundle_sections" / "digits_no_weights", fuzz::join_sections(parts));
    save(out / "bundle" / "digits_no_weights", as_bundle(parts));
    save(out / "runtime_json" / "digits.json", parts[2]);
    save(out / "labels_json" / "digits.json", parts[3]);

    save(out / "safetensors" / "every_dtype.safetensors", every_dtype_safetensors());
    save(out / "safetensors" / "resnet_basic_trimmed.safetensors",
         trimmed_safetensors(fixtures / "resnet" / "basic" / "model.safetensors", 1000, 2));
    save(out / "safetensors" / "effnet_b0_trimmed.safetensors",
         trimmed_safetensors(fixtures / "efficientnet" / "b0_narrow" / "model.safetensors", 24, 3));

    // Index for the trimmed file: the real tensor names, two shards.
    json wm = json::object();
    size_t i = 0;
    for (const auto& [name, t] : read_safetensors(fixtures / "resnet" / "basic" / "model.safetensors").tensors)
      wm[name] = (i++ % 2) ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    save(out / "safetensors_index" / "resnet_basic.index.json",
         bytes_of(json{{"metadata", {{"total_size", 123456}}}, {"weight_map", wm}}.dump(2)));

    // npy in every dtype the reader accepts, and shapes numpy writes.
    save(out / "npy" / "f16_2x3.npy", encode_npy(ramp(DType::F16, {2, 3})));
    save(out / "npy" / "f32_scalar.npy", encode_npy(ramp(DType::F32, {})));
    save(out / "npy" / "f32_empty.npy", encode_npy(ramp(DType::F32, {0, 5})));
    HostTensor i64{DType::I64, {3}, Blob::copy_of("\1\0\0\0\0\0\0\0\2\0\0\0\0\0\0\0\3\0\0\0\0\0\0\0", 24)};
    save(out / "npy" / "i64_3.npy", encode_npy(i64));
    HostTensor i32{DType::I32, {1, 2}, Blob::copy_of("\7\0\0\0\10\0\0\0", 8)};
    save(out / "npy" / "i32_1x2.npy", encode_npy(i32));
    HostTensor u8{DType::U8, {2, 2, 1}, Blob::copy_of("\1\2\3\4", 4)};
    save(out / "npy" / "u8_2x2x1.npy", encode_npy(u8));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
