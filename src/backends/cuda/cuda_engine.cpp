#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/file.hpp"

#include "backends/cuda/cuda_program.hpp"
#include "backends/cuda/kernels.hpp"
#include "core/error.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

namespace {

DeviceBuffer upload(const void* data, size_t bytes) {
  DeviceBuffer b(bytes);
  if (bytes) KILN_CUDA_CHECK(cudaMemcpy(b.get(), data, bytes, cudaMemcpyHostToDevice));
  return b;
}

DeviceBuffer upload_f32(const std::vector<float>& v) { return upload(v.data(), v.size() * sizeof(float)); }

int as_int(int64_t v) { return static_cast<int>(v); }


// The tactic cache (CudaOptions::tactic_cache; `kiln build --tactic-cache`,
// default ~/.cache/kiln/tactics.json) = {gpu key: {layer signature: [tactic, us]}}.
// Timed choices are reused by later builds on the same GPU, driver and
// library versions. A missing or damaged file is ignored (it is only a
// cache); `--tactic-cache off` disables it.

nlohmann::json read_tactic_cache(const std::filesystem::path& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) return nlohmann::json::object();
  try {
    Blob b = map_file(path);
    auto j = nlohmann::json::parse(b.data, b.data + b.size, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  } catch (const Error&) {
    return nlohmann::json::object();
  }
}

void load_tuned(const std::filesystem::path& path, const GpuKey& key, TunedCache* tuned) {
  auto j = read_tactic_cache(path);
  auto it = j.find(key.str());
  if (it == j.end() || !it->is_object()) return;
  for (const auto& [sig, v] : it->items())
    if (v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_number())
      (*tuned)[sig] = {v[0].get<std::string>(), v[1].get<float>()};
}

void save_tuned(const std::filesystem::path& path, const GpuKey& key, const TunedCache& tuned) {
  if (path.empty() || tuned.empty()) return;
  try {
    std::filesystem::create_directories(path.parent_path());
    auto j = read_tactic_cache(path);
    auto& mine = j[key.str()];
    if (!mine.is_object()) mine = nlohmann::json::object();
    for (const auto& [sig, v] : tuned) mine[sig] = {v.first, v.second};
    const std::string text = j.dump(1);
    write_file_atomic(path, [&](std::FILE* f) { write_all(f, text.data(), text.size()); });
  } catch (const std::exception&) {
    // A read-only home or full disk must not fail a build: the cache is an optimisation.
  }
}

}  // namespace

bool device_available(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    if (why) *why = e != cudaSuccess ? cat("no usable CUDA device (", cudaGetErrorString(e), ")") : "no CUDA device";
    return false;
  }
  return true;
}

std::string GpuKey::str() const { return cat(gpu, " | driver ", driver, " | cuDNN ", cudnn, " | cuBLASLt ", cublaslt); }

GpuKey current_gpu_key() {
  GpuKey k;
  cudaDeviceProp prop{};
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  k.gpu = prop.name;
  cudaDriverGetVersion(&k.driver);
  k.cudnn = static_cast<int>(cudnnGetVersion());
  k.cublaslt = static_cast<int>(cublasLtGetVersion());
  return k;
}

std::string gpu_slug(const std::string& gpu) {
  std::string s;
  for (char c : gpu) s += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '_';
  return s;
}

const void* CudaEngine::Program::value_ptr(const Exec& x, int v) const {
  return x.arena + memory.offsets.at(v) + (view_bytes.empty() ? 0 : view_bytes[v]);
}

CudaEngine::CudaEngine(const Graph& g, const CudaOptions& opts) {
  std::string why;
  if (!device_available(&why))
    fail_runtime("the CUDA backend needs a GPU: ", why, " (build with --backend cpu, or run a CUDA bundle with --backend cpu)");
  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.graph = &g;
  m.opts = opts;
  m.key = current_gpu_key();
  if (opts.tactics.is_object()) {
    const auto& k = opts.tactics.value("key", nlohmann::json::object());
    bool same = k.value("gpu", "") == m.key.gpu && k.value("driver", 0) == m.key.driver && k.value("cudnn", 0) == m.key.cudnn &&
                k.value("cublaslt", 0) == m.key.cublaslt;
    if (!same) {
      m.retuned = true;
      if (opts.log)
        *opts.log << "kiln: the bundle's tactics were selected for [" << k.value("gpu", "?") << " | driver "
                  << k.value("driver", 0) << " | cuDNN " << k.value("cudnn", 0) << "]; re-selecting for [" << m.key.str()
                  << "] by heuristics (rebuild the bundle on this GPU for timed tactics)\n";
    }
  }
  const PhaseCounters before = phase_counters();
  // Weights: once per engine. Conv filters go KCRS -> KRSC for NHWC convolution.
  std::optional<PhaseTimer> upload_timer(&phase_counters().weights_upload);
  for (const Node& n : g.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      int v = n.inputs[i];
      if (!g.values[v].constant || m.weights.count(v)) continue;
      // A quantized layer's 8-bit weight is padded and uploaded by its lowering (quant.cpp).
      if (i == 1 && is_quantized_layer(g, n)) continue;
      const HostTensor& t = *g.values[v].constant;
      if (n.op == Op::Conv2d && i == 1) {
        auto f = t.to_f32();
        auto krsc = kcrs_to_krsc(f.data(), as_int(t.shape[0]), as_int(t.shape[1]), as_int(t.shape[2]), as_int(t.shape[3]));
        HostTensor k = HostTensor::from_f32_as(t.dtype, t.shape, krsc);
        m.weights.emplace(v, upload(k.blob.data, k.nbytes()));
      } else if (n.op != Op::BatchNorm) {
        m.weights.emplace(v, upload(t.blob.data, t.nbytes()));
      }
    }
    if (n.op == Op::BatchNorm) {
      auto sc = g.values[n.inputs[1]].constant->to_f32(), b = g.values[n.inputs[2]].constant->to_f32();
      auto mean = g.values[n.inputs[3]].constant->to_f32(), var = g.values[n.inputs[4]].constant->to_f32();
      const double eps = n.attr_float("eps", 1e-5);
      std::vector<float> scale(sc.size()), shift(sc.size());
      for (size_t c = 0; c < sc.size(); ++c) {
        double s = sc[c] / std::sqrt(static_cast<double>(var[c]) + eps);
        scale[c] = static_cast<float>(s);
        shift[c] = static_cast<float>(b[c] - mean[c] * s);
      }
      m.bn.emplace(n.name, std::make_pair(upload_f32(scale), upload_f32(shift)));
    }
  }
  KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads' time, not the first lowering's
  upload_timer.reset();
  if (opts.tune && opts.opt_level >= 3) load_tuned(opts.tactic_cache, m.key, &m.tuned);
  const int64_t batch = g.inputs.empty() ? 1 : g.values[g.inputs[0]].shape.at(0);
  m.programs[batch] = m.build_program(batch);
  for (int64_t b : opts.batches)
    if (!m.programs.count(b)) m.programs[b] = m.build_program(b);
  m.opts.progress = nullptr;  // it may capture the caller's locals
  if (opts.tune && opts.opt_level >= 3) save_tuned(opts.tactic_cache, m.key, m.tuned);
  m.load_phases = phase_counters() - before;
}

CudaEngine::~CudaEngine() = default;
bool CudaEngine::retuned() const { return impl_->retuned; }
int CudaEngine::timed_layers() const { return impl_->timed_layers; }
const PhaseCounters& CudaEngine::load_phases() const { return impl_->load_phases; }

nlohmann::json CudaEngine::tactics_json() const {
  const Impl& m = *impl_;
  nlohmann::json batches = nlohmann::json::object();
  nlohmann::json first;
  // Every planned batch gets an entry, also one whose nodes chose no tactic
  // (all on the plain reference path): its plan must travel all the same.
  std::set<int64_t> planned;
  for (const auto& kv : m.chosen) planned.insert(kv.first);
  for (const auto& kv : m.programs) planned.insert(kv.first);
  static const std::map<std::string, std::string> kNone;
  for (const int64_t batch : planned) {
    const auto ch = m.chosen.find(batch);
    const auto& chosen = ch == m.chosen.end() ? kNone : ch->second;
    nlohmann::json layers = nlohmann::json::object();
    const auto us = m.chosen_us.find(batch);
    for (const auto& [name, tactic] : chosen) {
      layers[name] = {{"tactic", tactic}};
      if (us == m.chosen_us.end()) continue;
      auto it = us->second.find(name);
      if (it != us->second.end()) layers[name]["time_us"] = it->second;
    }
    if (first.is_null()) first = layers;
    batches[std::to_string(batch)] = {{"layers", layers}};
    auto prog = m.programs.find(batch);
    if (prog != m.programs.end()) batches[std::to_string(batch)]["plan"] = prog->second->plan_json();
  }
  return {{"key", {{"gpu", m.key.gpu}, {"driver", m.key.driver}, {"cudnn", m.key.cudnn}, {"cublaslt", m.key.cublaslt}}},
          {"opt_level", m.opts.opt_level},
          {"batches", batches},
          {"layers", first.is_null() ? nlohmann::json::object() : first}};
}

const nlohmann::json* CudaEngine::Impl::recorded_layers(int64_t batch) const {
  if (retuned || !opts.tactics.is_object()) return nullptr;
  auto bs = opts.tactics.find("batches");
  if (bs != opts.tactics.end() && bs->is_object()) {
    auto it = bs->find(std::to_string(batch));
    if (it == bs->end() || !it->is_object()) return nullptr;
    auto l = it->find("layers");
    return l != it->end() && l->is_object() ? &*l : nullptr;
  }
  // A bundle from before per-batch records: its "layers" are those of the graph's batch.
  const int64_t built = graph->inputs.empty() ? 1 : graph->values[graph->inputs[0]].shape.at(0);
  auto l = opts.tactics.find("layers");
  return batch == built && l != opts.tactics.end() && l->is_object() ? &*l : nullptr;
}

std::string CudaEngine::Impl::recorded_tactic(int64_t batch, const std::string& node) const {
  const nlohmann::json* layers = recorded_layers(batch);
  if (!layers) return "";
  auto it = layers->find(node);
  if (it == layers->end() || !it->is_object()) return "";
  auto t = it->find("tactic");
  return t != it->end() && t->is_string() ? recorded_tactic_name(t->get<std::string>()) : "";
}

const nlohmann::json* CudaEngine::Impl::recorded_plan(int64_t batch) const {
  if (retuned || !opts.tactics.is_object()) return nullptr;
  auto bs = opts.tactics.find("batches");
  if (bs == opts.tactics.end() || !bs->is_object()) return nullptr;
  auto it = bs->find(std::to_string(batch));
  if (it == bs->end() || !it->is_object()) return nullptr;
  auto p = it->find("plan");
  if (p == it->end()) return nullptr;  // bundles from before the plan section
  if (!p->is_object()) fail_input("the bundle's CUDA plan for batch ", batch, " is not an object");
  return &*p;
}

std::shared_ptr<CudaEngine::Program> CudaEngine::Impl::program_for(int64_t batch) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = programs.find(batch);
  if (it != programs.end()) return it->second;
  if (!opts.tune && !retuned && opts.tactics.is_object() && !recorded_layers(batch) && opts.log)
    *opts.log << "kiln: batch " << batch << " was not built into this bundle; its tactics are chosen by heuristics, "
              << "without timing (build with --batch " << batch << " to record timed ones)\n";
  return programs[batch] = build_program(batch);
}

}  // namespace kiln::cuda
