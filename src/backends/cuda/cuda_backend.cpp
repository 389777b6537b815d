// The CUDA backend behind the backend interface (backends/backend.hpp), over
// CudaEngine and CudaContext. Compiled only in CUDA builds; CMake then lists
// register_backend_cuda in the generated backend registry.
#include "backends/backend.hpp"
#include "ir/node_select.hpp"
#include <algorithm>
#include <cstring>

#include "backends/cuda/classify_post.hpp"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/cuda_engine.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/image_preprocess.hpp"
#include "backends/cuda/lower.hpp"
#include "bundle/bundle.hpp"
#include "bundle/tactics_record.hpp"
#include "core/error.hpp"

namespace kiln::cuda {
namespace {

// Whether softmax_top_k can post-process output top.output: a [batch, classes]
// host view and a k it takes.
bool device_top_k_fits(const DeviceTopK& top, const std::vector<MutableTensorView>& outputs, int64_t batch) {
  if (top.output < 0 || static_cast<size_t>(top.output) >= outputs.size()) return false;
  const MutableTensorView& v = outputs[top.output];
  return v.where == MemoryKind::Host && v.shape.size() == 2 && v.shape[0] == batch && v.shape[1] >= top.k &&
         v.shape[1] <= (int64_t{1} << 30) && top.k >= 1 && top.k <= kMaxDeviceTopK;
}

double elapsed_ms(const Event& a, const Event& b) {
  float ms = 0.f;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a.e, b.e));
  return ms;
}

class CudaBackendContext : public BackendContext {
 public:
  explicit CudaBackendContext(std::shared_ptr<CudaEngine> engine) : ctx_(std::move(engine)) {}
  void run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs, int64_t batch,
           void* stream) override {
    ctx_.run(inputs, outputs, batch, stream);
  }
  bool preprocesses_on_device() const override { return true; }
  // The batch's bytes (each image, then its plan's tables) go into one
  // pinned buffer, copied up in a few large async copies, each queued as soon
  // as its bytes are there (so the copy of one part overlaps the host's
  // memcpy of the next); the plan's kernels (GpuPreprocessor) write each
  // image's slot of the engine's own staged input, and the graph replays from
  // it on the same stream. No wait between images, no upload per table (each
  // was a host API call) and no copy of the pre-processed tensor. With `top`,
  // softmax and top-k run after the graph and the logits come back with their
  // result in one copy.
  ImageRunTimes run_images(const std::vector<RgbView>& images, const std::vector<const PreprocessPlan*>& plans,
                           const TensorView& input, const std::vector<MutableTensorView>& outputs, int64_t batch,
                           DeviceTopK* top) override {
    const size_t per_image = static_cast<size_t>(shape_numel(input.shape) / batch);
    cudaStream_t s = stream_.s;
    auto align = [](size_t n) { return (n + 255) / 256 * 256; };
    std::vector<size_t> at(images.size()), tables_at(images.size());
    size_t total = 0;
    for (size_t k = 0; k < images.size(); ++k) {
      at[k] = total;
      tables_at[k] = total + align(images[k].bytes());
      total = tables_at[k] + align(GpuPreprocessor::table_bytes(*plans[k]));
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // nothing queued still reads the staging buffers
    float* chw = ctx_.staged_input(batch, 0, s);
    if (pinned_.size() < total) pinned_ = PinnedBuffer(total);
    if (rgb_.size() < total) rgb_ = DeviceBuffer(total);
    char* host = pinned_.get();
    char* dev = static_cast<char*>(rgb_.get());
    KILN_CUDA_CHECK(cudaEventRecord(before_.e, s));
    // Host bytes [sent, filled) are written and not yet queued for the copy up.
    size_t sent = 0;
    auto send = [&](size_t filled) {
      if (filled > sent) KILN_CUDA_CHECK(cudaMemcpyAsync(dev + sent, host + sent, filled - sent, cudaMemcpyHostToDevice, s));
      sent = filled;
    };
    constexpr size_t kChunk = size_t{192} << 10;  // a 500x375 image: 3 copies
    for (size_t k = 0; k < images.size(); ++k) {
      const RgbView& img = images[k];
      for (size_t off = 0; off < img.bytes(); off += kChunk) {
        const size_t n = std::min(kChunk, img.bytes() - off);
        std::memcpy(host + at[k] + off, img.rgb + off, n);
        if (off + n < img.bytes()) send(at[k] + off + n);
      }
      GpuPreprocessor::write_tables(*plans[k], host + tables_at[k]);
      send(k + 1 < images.size() ? at[k + 1] : total);
      if (k + 1 == images.size()) KILN_CUDA_CHECK(cudaEventRecord(uploaded_.e, s));
      pre_.run(*plans[k], reinterpret_cast<const uint8_t*>(dev + at[k]), chw + k * per_image, s, dev + tables_at[k]);
    }
    KILN_CUDA_CHECK(cudaEventRecord(after_.e, s));
    ImageRunTimes times;
    const bool post = top && device_top_k_fits(*top, outputs, batch);
    if (!post) {
      ctx_.run_staged(outputs, batch, s);
    } else {
      // The logits land in device memory, softmax_top_k writes after them, one copy brings all back.
      const MutableTensorView& lv = outputs[top->output];
      const size_t logits = static_cast<size_t>(shape_numel(lv.shape)), picks = static_cast<size_t>(batch) * top->k;
      const size_t bytes = (logits + 2 * picks) * sizeof(float);
      if (post_dev_.size() < bytes) post_dev_ = DeviceBuffer(bytes);
      if (post_host_.size() < bytes) post_host_ = PinnedBuffer(bytes);
      float* d = static_cast<float*>(post_dev_.get());
      std::vector<MutableTensorView> outs = outputs;
      outs[top->output].data = d;
      outs[top->output].where = MemoryKind::Device;
      ctx_.run_staged(outs, batch, s);
      const int classes = static_cast<int>(lv.shape.back());
      softmax_top_k(d, static_cast<int>(batch), classes, top->k, reinterpret_cast<int*>(d + logits + picks), d + logits, s);
      KILN_CUDA_CHECK(cudaEventRecord(down0_.e, s));
      KILN_CUDA_CHECK(cudaMemcpyAsync(post_host_.get(), d, bytes, cudaMemcpyDeviceToHost, s));
      KILN_CUDA_CHECK(cudaEventRecord(down1_.e, s));
      KILN_CUDA_CHECK(cudaStreamSynchronize(s));
      times.download_ms = elapsed_ms(down0_, down1_);
      const float* h = reinterpret_cast<const float*>(post_host_.get());
      std::memcpy(lv.data, h, logits * sizeof(float));
      top->probs.assign(h + logits, h + logits + picks);
      const int* ids = reinterpret_cast<const int*>(h + logits + picks);
      top->ids.assign(ids, ids + picks);
      top->done = true;
    }
    times.upload_ms = elapsed_ms(before_, uploaded_);
    times.preprocess_ms = elapsed_ms(uploaded_, after_);
    return times;
  }
  double timed_call_ms(int64_t batch) override { return ctx_.timed_replay_ms(batch); }
  CallTrace trace(int64_t batch, int replays) override { return ctx_.trace(batch, replays); }
  std::vector<LayerTime> profile(int64_t batch, int rounds) override {
    std::vector<LayerTime> out;
    for (auto& s : ctx_.profile(batch, rounds)) {
      if (!out.empty() && out.back().name == s.name) {  // several steps of one node
        out.back().ms += s.ms;
        out.back().kernels.insert(out.back().kernels.end(), s.kernels.begin(), s.kernels.end());
      } else {
        out.push_back({s.name, s.ms, s.kernels, s.kernels_unavailable});
      }
    }
    return out;
  }
  size_t kernels_per_call(int64_t batch) override { return ctx_.graph_nodes(batch); }
  MemoryReport memory(int64_t batch) override { return ctx_.memory(batch); }
  std::vector<std::pair<std::string, double>> first_call_phases() const override { return ctx_.first_call_phases().items(); }

 private:
  // Declared first, destroyed last: ctx_ may still run on stream_.
  Stream stream_;
  Event before_, uploaded_, after_, down0_, down1_;
  PinnedBuffer pinned_, post_host_;
  DeviceBuffer rgb_, post_dev_;
  GpuPreprocessor pre_;
  CudaContext ctx_;
};

class CudaCompiled : public CompiledEngine {
 public:
  explicit CudaCompiled(std::shared_ptr<CudaEngine> engine) : engine_(std::move(engine)) {}
  std::unique_ptr<BackendContext> create_context() const override {
    return std::make_unique<CudaBackendContext>(engine_);
  }
  std::vector<std::pair<std::string, std::string>> record() const override {
    // Tactics chosen on this GPU now; a bundle loaded on another GPU (or
    // driver/library version) re-selects by heuristics.
    const nlohmann::json tactics = engine_->tactics_json();
    return {{"tactics." + gpu_slug(tactics["key"]["gpu"].get<std::string>()) + ".json", tactics.dump()}};  // compact: part of the plan size
  }
  int timed_layers() const override { return engine_->timed_layers(); }
  std::vector<std::pair<std::string, double>> load_phases() const override { return engine_->load_phases().items(); }

 private:
  std::shared_ptr<CudaEngine> engine_;
};

class CudaBackend : public Backend {
 public:
  const char* name() const override { return "cuda"; }
  std::string available() const override {
    std::string why;
    return device_available(&why) ? "" : why;
  }
  // Ops the lowering does not take yet, naming the first such node (lower.cpp);
  // rank- and attribute-dependent refusals come from compile, naming the node.
  std::string supports(const Graph& g) const override { return lowering_refusal(g); }
  // cuDNN's fast NHWC kernels want 16-byte channel rows.
  int64_t channel_align_bytes() const override { return 16; }

  std::shared_ptr<const CompiledEngine> compile(const Graph& g, const CompileOptions& o) const override {
    // Every --reference pattern must name a node (the message names the pattern).
    if (!o.reference.empty()) select_nodes(g, o.reference, o.tune ? "--reference pattern" : o.source + "reference pattern");
    if (const std::string why = available(); !why.empty()) {
      if (o.tune) fail_runtime("the CUDA backend needs a GPU: ", why, " (build with --backend cpu)");
      fail_runtime(o.source, "this is a CUDA bundle and ", why,
                   "; run it on the CPU with --backend cpu (LoadOptions::backend = \"cpu\")");
    }
    CudaOptions co;
    co.opt_level = o.opt_level;
    co.allow_tf32 = o.allow_tf32;
    co.switches = o.switches;
    co.reference = o.reference;
    co.tune = o.tune;
    co.batches = o.batches;
    co.log = o.log;
    co.progress = o.progress;
    if (o.tune) co.tactic_cache = o.tactic_cache;  // loading never reads or writes the cache
    if (o.bundle) {
      // The record of this GPU when the bundle has one, else any (its key then says another GPU: re-selected).
      const std::string mine = "tactics." + gpu_slug(current_gpu_key().gpu) + ".json";
      for (const auto& name : o.bundle->section_names())
        if (name.rfind("tactics.", 0) == 0 && (co.tactics.is_null() || name == mine)) {
          co.tactics = parse_tactics_record(o.bundle->section_text(name), o.source + name);
        }
    }
    return std::make_shared<CudaCompiled>(std::make_shared<CudaEngine>(g, co));
  }
};

}  // namespace
}  // namespace kiln::cuda

namespace kiln {
void register_backend_cuda(BackendRegistry& r) { r.add(std::make_unique<cuda::CudaBackend>()); }
}  // namespace kiln
