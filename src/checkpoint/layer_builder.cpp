#include "checkpoint/layer_builder.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace kiln {

LayerBuilder::LayerBuilder(const Checkpoint& ckpt, std::string family) : ckpt_(ckpt), family_(std::move(family)) {}

const Shape& LayerBuilder::shape_of(const std::string& tensor) const {
  if (!ckpt_.has(tensor)) fail_input(family_, ": checkpoint ", ckpt_.source().string(), " has no tensor '", tensor, "'");
  return ckpt_.get(tensor).shape;
}

int LayerBuilder::weight(const std::string& tensor) {
  shape_of(tensor);
  const HostTensor& t = ckpt_.get(tensor);
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    fail_input(family_, ": tensor '", tensor, "' in ", ckpt_.file_of(tensor), " has dtype ", dtype_safetensors_name(t.dtype),
               ", which this family cannot use (F32, F16 or BF16)");
  used_.insert(tensor);
  HostTensor f32 = t.dtype == DType::F32 ? t : HostTensor::from_f32(t.shape, t.to_f32());
  return graph_.add_constant(tensor, std::move(f32));
}

int LayerBuilder::conv(const std::string& prefix, int x, const ConvSpec& spec) {
  const std::string wname = prefix + ".weight";
  const Shape& ws = shape_of(wname);
  if (ws.size() != 4) fail_input(family_, ": tensor '", wname, "' has shape ", shape_str(ws), ", expected a 4-D conv weight");
  const Shape& xs = graph_.values.at(x).shape;
  if (xs.size() != 4 || ws[1] == 0 || xs[1] % ws[1] != 0)
    fail_input(family_, ": tensor '", wname, "' ", shape_str(ws), " does not fit its input of ", xs.size() > 1 ? xs[1] : 0,
               " channels");
  const int64_t groups = xs[1] / ws[1];
  std::vector<int> inputs = {x, weight(wname)};
  if (has(prefix + ".bias")) inputs.push_back(weight(prefix + ".bias"));
  const int64_t ph = spec.padding >= 0 ? spec.padding : (ws[2] - 1) / 2 * spec.dilation;
  const int64_t pw = spec.padding >= 0 ? spec.padding : (ws[3] - 1) / 2 * spec.dilation;
  std::vector<int64_t> pads{ph, pw, ph, pw};
  if (spec.pads[0] >= 0) pads.assign(spec.pads.begin(), spec.pads.end());
  Attrs a = {{"strides", std::vector<int64_t>{spec.stride, spec.stride}},
             {"pads", std::move(pads)},
             {"dilations", std::vector<int64_t>{spec.dilation, spec.dilation}},
             {"groups", groups}};
  return graph_.add_node(Op::Conv2d, prefix, inputs, std::move(a));
}

std::array<int, 4> tf_same_pads(const Shape& x, const Shape& weight, int stride, int dilation) {
  auto total = [&](int64_t in, int64_t k) {
    const int64_t out = (in + stride - 1) / stride;
    return static_cast<int>(std::max<int64_t>((out - 1) * stride + (k - 1) * dilation + 1 - in, 0));
  };
  const int ph = total(x.at(2), weight.at(2)), pw = total(x.at(3), weight.at(3));
  return {ph / 2, pw / 2, ph - ph / 2, pw - pw / 2};
}

int LayerBuilder::batch_norm(const std::string& prefix, int x, double eps) {
  std::vector<int> inputs = {x};
  for (const char* part : {".weight", ".bias", ".running_mean", ".running_var"}) inputs.push_back(weight(prefix + part));
  return graph_.add_node(Op::BatchNorm, prefix, inputs, {{"eps", eps}});
}

int LayerBuilder::act(const std::string& name, int x, Activation a) {
  return graph_.add_node(Op::Activation, name, {x}, {{"activation", std::string(activation_name(a))}});
}

int LayerBuilder::linear(const std::string& prefix, int x) {
  std::vector<int> inputs = {x, weight(prefix + ".weight")};
  if (has(prefix + ".bias")) inputs.push_back(weight(prefix + ".bias"));
  return graph_.add_node(Op::Linear, prefix, inputs);
}

void LayerBuilder::check_all_used(const std::string& ignored_suffix) const {
  for (const auto& name : ckpt_.names()) {
    if (used_.count(name)) continue;
    if (!ignored_suffix.empty() && name.size() >= ignored_suffix.size() &&
        name.compare(name.size() - ignored_suffix.size(), ignored_suffix.size(), ignored_suffix) == 0)
      continue;
    fail_input(family_, ": unexpected tensor '", name, "' ", shape_str(ckpt_.get(name).shape), " in ", ckpt_.file_of(name),
               " (not part of any layer this family understands)");
  }
}

}  // namespace kiln
