#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"
#include "image/image.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln {

ExecutionContext::ExecutionContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExecutionContext::~ExecutionContext() = default;

namespace {

std::string expected_input_shape(const Shape& want) {
  std::string s = "[N";
  for (size_t d = 1; d < want.size(); ++d) s += "," + std::to_string(want[d]);
  return s + "]";
}

// f16/bf16 host values widened to f32 (exact).
std::vector<float> widen(const TensorView& t) {
  std::vector<float> f(static_cast<size_t>(shape_numel(t.shape)));
  const auto* p = static_cast<const uint8_t*>(t.data);
  for (size_t i = 0; i < f.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    f[i] = t.dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  return f;
}

// Checks every input view against the engine (name, shape, batch, dtype,
// size, data) before any is read; returns the batch. `ordered` receives the
// views in graph order, f16/bf16 ones converted to f32 (held in `widened`).
// exact_values: Tensor inputs, whose `bytes` is their value count x 4 and must match the shape.
int64_t bind_inputs(const Engine::Impl& e, const std::vector<TensorView>& inputs, bool exact_values,
                    std::vector<TensorView>* ordered, std::vector<std::vector<float>>* widened) {
  const Graph& g = e.graph;
  std::vector<const TensorView*> by_input(g.inputs.size(), nullptr);
  int64_t batch = -1;
  for (const TensorView& t : inputs) {
    auto it = std::find_if(g.inputs.begin(), g.inputs.end(), [&](int v) { return g.values[v].name == t.name; });
    if (it == g.inputs.end()) fail_input("input '", t.name, "' is not an input of this engine");
    const size_t k = static_cast<size_t>(it - g.inputs.begin());
    if (by_input[k]) fail_input("input '", t.name, "' given twice");
    const Shape& want = g.values[*it].shape;
    bool ok = t.shape.size() == want.size() && !t.shape.empty() && t.shape[0] >= 1;
    for (size_t d = 1; ok && d < want.size(); ++d) ok = t.shape[d] == want[d];
    if (!ok) fail_input("input '", t.name, "' has shape ", shape_str(t.shape), ", expected ", expected_input_shape(want));
    if (t.shape[0] > e.max_batch)
      fail_input("input '", t.name, "' has batch ", t.shape[0], ", above this engine's largest batch ", e.max_batch,
                 " (rebuild with a larger --max-batch)");
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
      fail_input("input '", t.name, "' is ", dtype_name(t.dtype), ": inputs are f32 (f16 and bf16 host buffers are converted)");
    if (t.dtype != DType::F32 && t.where == MemoryKind::Device)
      fail_input("input '", t.name, "' is ", dtype_name(t.dtype), " device memory: device inputs are f32 only (f16 and bf16 "
                 "are converted from host memory)");
    const size_t need = static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (exact_values && t.bytes != need)
      fail_input("input '", t.name, "' has ", t.bytes / sizeof(float), " values for shape ", shape_str(t.shape));
    if (t.bytes != 0 && t.bytes < need)
      fail_usage("input '", t.name, "' has ", t.bytes, " bytes, its shape ", shape_str(t.shape), " of ", dtype_name(t.dtype),
                 " needs ", need);
    if (!t.data) fail_usage("input '", t.name, "': data is NULL");
    if (batch >= 0 && batch != t.shape[0]) fail_input("inputs disagree on the batch size");
    batch = t.shape[0];
    by_input[k] = &t;
  }
  for (size_t k = 0; k < g.inputs.size(); ++k)
    if (!by_input[k]) fail_input("input '", g.values[g.inputs[k]].name, "' is missing");
  ordered->clear();
  for (const TensorView* t : by_input) {
    ordered->push_back(*t);
    if (t->dtype == DType::F32) continue;
    widened->push_back(widen(*t));  // the inner buffer stays put when `widened` grows
    ordered->back().dtype = DType::F32;
    ordered->back().data = widened->back().data();
    ordered->back().bytes = widened->back().size() * sizeof(float);
  }
  return batch;
}

// Checks every output view (name, dtype, shape at `batch`, capacity, data);
// `ordered` receives them in graph order.
void bind_outputs(const Engine::Impl& e, int64_t batch, const std::vector<MutableTensorView>& outputs,
                  std::vector<MutableTensorView>* ordered) {
  const Graph& g = e.graph;
  const std::vector<Shape>& shapes = e.output_shapes(batch);
  std::vector<const MutableTensorView*> by_output(g.outputs.size(), nullptr);
  for (const MutableTensorView& t : outputs) {
    auto it = std::find_if(g.outputs.begin(), g.outputs.end(), [&](int v) { return g.values[v].name == t.name; });
    if (it == g.outputs.end()) fail_input("output '", t.name, "' is not an output of this engine");
    const size_t k = static_cast<size_t>(it - g.outputs.begin());
    if (by_output[k]) fail_input("output '", t.name, "' given twice");
    if (t.dtype != DType::F32) fail_input("output '", t.name, "' is ", dtype_name(t.dtype), ": outputs are written as f32");
    if (t.shape != shapes[k])
      fail_input("output '", t.name, "' has shape ", shape_str(t.shape), ", expected ", shape_str(shapes[k]), " at batch ",
                 batch);
    const size_t need = static_cast<size_t>(shape_numel(shapes[k])) * sizeof(float);
    if (t.capacity < need) fail_usage("output '", t.name, "' needs ", need, " bytes, capacity is ", t.capacity);
    if (!t.data) fail_usage("output '", t.name, "': data is NULL");
    by_output[k] = &t;
  }
  for (size_t k = 0; k < g.outputs.size(); ++k)
    if (!by_output[k]) fail_input("output '", g.values[g.outputs[k]].name, "' is missing");
  ordered->clear();
  for (const MutableTensorView* t : by_output) ordered->push_back(*t);
}

// Host tensors for every output at `batch`, and `out`: views of them.
std::vector<Tensor> host_outputs(const Engine::Impl& e, int64_t batch, std::vector<MutableTensorView>* out) {
  const std::vector<Shape>& shapes = e.output_shapes(batch);
  std::vector<Tensor> result;
  for (size_t k = 0; k < shapes.size(); ++k)
    result.push_back({e.graph.values[e.graph.outputs[k]].name, shapes[k],
                      std::vector<float>(static_cast<size_t>(shape_numel(shapes[k])))});
  out->clear();
  for (Tensor& t : result)
    out->push_back({t.name, DType::F32, t.shape, t.data.data(), MemoryKind::Host, t.data.size() * sizeof(float)});
  return result;
}

}  // namespace

void ExecutionContext::run(const std::vector<TensorView>& inputs, const std::vector<MutableTensorView>& outputs,
                           void* stream) {
  const Engine::Impl& e = impl_->engine->impl();
  std::vector<TensorView> in;
  std::vector<std::vector<float>> widened;
  std::vector<MutableTensorView> out;
  const int64_t batch = bind_inputs(e, inputs, false, &in, &widened);
  bind_outputs(e, batch, outputs, &out);
  impl_->backend->run(in, out, batch, stream);
  impl_->last_batch = batch;
}

std::vector<Tensor> ExecutionContext::run(const std::vector<Tensor>& inputs) {
  const Engine::Impl& e = impl_->engine->impl();
  std::vector<TensorView> views;
  for (const Tensor& t : inputs)
    views.push_back({t.name, DType::F32, t.shape, t.data.data(), MemoryKind::Host, t.data.size() * sizeof(float)});
  std::vector<TensorView> in;
  std::vector<std::vector<float>> widened;
  const int64_t batch = bind_inputs(e, views, true, &in, &widened);
  std::vector<MutableTensorView> out;
  std::vector<Tensor> result = host_outputs(e, batch, &out);
  impl_->backend->run(in, out, batch, nullptr);
  impl_->last_batch = batch;
  return result;
}

double timed_engine_call_ms(ExecutionContext& ctx, const std::vector<Tensor>& inputs) {
  ExecutionContext::Impl& c = ctx.impl();
  const int64_t batch = inputs.empty() || inputs[0].shape.empty() ? 1 : inputs[0].shape[0];
  if (c.last_batch != batch) ctx.run(inputs);  // plans (and on the GPU captures) this batch size: never timed
  return c.backend->timed_call_ms(batch);
}

std::vector<LayerTime> profile_layers(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int rounds) {
  ctx.run(inputs);  // plans (and on the GPU captures) for this batch size
  return ctx.impl().backend->profile(ctx.impl().last_batch, rounds);
}

CallTrace trace_call(ExecutionContext& ctx, const std::vector<Tensor>& inputs, int replays) {
  ctx.run(inputs);  // plans (and on the GPU captures) for this batch size
  return ctx.impl().backend->trace(ctx.impl().last_batch, replays);
}

bool preprocesses_on_device(ExecutionContext& ctx) { return ctx.impl().backend->preprocesses_on_device(); }

std::vector<Tensor> run_images(ExecutionContext& ctx, const std::vector<RgbView>& images,
                               const std::vector<const PreprocessPlan*>& plans, ImageRunTimes* times, DeviceTopK* top) {
  ExecutionContext::Impl& c = ctx.impl();
  const Engine::Impl& e = c.engine->impl();
  if (images.empty() || images.size() != plans.size()) fail_usage("run_images: ", images.size(), " images, ", plans.size(), " plans");
  if (e.graph.inputs.size() != 1) fail_input("run_images: this engine has ", e.graph.inputs.size(), " inputs, images feed one");
  const Value& in = e.graph.values[e.graph.inputs[0]];
  if (in.shape.size() != 4 || in.shape[1] != 3)
    fail_input("run_images: input '", in.name, "' is ", shape_str(in.shape), ", not [N,3,H,W]");
  for (size_t k = 0; k < images.size(); ++k) {
    const PreprocessPlan& p = *plans[k];
    if (p.out_h != in.shape[2] || p.out_w != in.shape[3])
      fail_input("run_images: image ", k, " is pre-processed to ", p.out_w, "x", p.out_h, ", input '", in.name, "' takes ",
                 in.shape[3], "x", in.shape[2]);
    if (p.resize.in_w != images[k].width || p.resize.in_h != images[k].height || !images[k].rgb)
      fail_input("run_images: image ", k, " (", images[k].width, "x", images[k].height, ") does not match its plan (",
                 p.resize.in_w, "x", p.resize.in_h, ")");
  }
  Shape shape = in.shape;
  shape[0] = static_cast<int64_t>(images.size());
  // The shape/batch checks of every run, on a view whose memory the backend fills.
  std::vector<TensorView> ordered;
  std::vector<std::vector<float>> widened;
  const int64_t batch =
      bind_inputs(e, {{in.name, DType::F32, shape, images[0].rgb, MemoryKind::Device, 0}}, false, &ordered, &widened);
  std::vector<MutableTensorView> out;
  std::vector<Tensor> result = host_outputs(e, batch, &out);
  if (c.backend->preprocesses_on_device()) {
    const ImageRunTimes t = c.backend->run_images(images, plans, ordered[0], out, batch, top);
    if (times) *times = t;
  } else {
    // The host executor of the same plans (what the device path must equal).
    std::vector<float> pixels;
    pixels.reserve(static_cast<size_t>(shape_numel(shape)));
    for (size_t k = 0; k < images.size(); ++k) {
      const ImageU8 copy{images[k].width, images[k].height, std::vector<uint8_t>(images[k].rgb, images[k].rgb + images[k].bytes())};
      const std::vector<float> chw = run_preprocess_plan(copy, *plans[k]);
      pixels.insert(pixels.end(), chw.begin(), chw.end());
    }
    c.backend->run({{in.name, DType::F32, shape, pixels.data(), MemoryKind::Host, pixels.size() * sizeof(float)}}, out, batch,
                   nullptr);
    if (times) *times = {};
  }
  c.last_batch = batch;
  return result;
}

std::vector<std::pair<std::string, double>> first_call_phases(ExecutionContext& ctx) {
  return ctx.impl().backend->first_call_phases();
}

size_t kernels_per_call(ExecutionContext& ctx) { return ctx.impl().backend->kernels_per_call(ctx.impl().batch_or_built()); }

MemoryReport ExecutionContext::memory() const {
  // Before any run: the plan of the batch size the bundle was built for.
  return impl_->backend->memory(impl_->batch_or_built());
}

}  // namespace kiln
