// kiln inspect BUNDLE: header, sections, layers (name, op, output, fused
// epilogue), op counts, memory plan and provenance.
#include <iomanip>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bundle/tactics_record.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "ir/printer.hpp"
#include "ir/serialize.hpp"
#include "runtime/views.hpp"
#include "runtime/engine_impl.hpp"

namespace kiln::cli {

namespace {

std::string fused(const Graph& g, const Node& n, const ChannelViews& cv, const cpu::PrologueAdds& adds, size_t index) {
  std::string s;
  const int out = n.outputs[0];
  if (n.op == Op::Slice && cv.is_view(out)) return "view (no copy)";
  if (adds.fused[index]) return "in next conv (no store)";
  if (adds.add_for(g, index)) s += "+input add";
  if (n.op == Op::Concat) {
    int in_place = 0;
    for (int in : n.inputs) in_place += cv.parent[in] == out;
    return cat(in_place, "/", n.inputs.size(), " inputs in place");
  }
  if (n.op == Op::Conv2d) {
    if (n.inputs.size() > 2) s += "+bias";
    if (n.inputs.size() > 3) s += "+residual";
  }
  if (n.activation() != Activation::None) s += std::string("+") + activation_name(n.activation());
  if (cv.is_view(out)) s += "+into concat";
  return s;
}

// The recorded CUDA plans (`kiln inspect --plan`): no GPU needed, they are read from the bundle.
void print_plans(const nlohmann::json& plans, const std::string& gpu) {
  if (plans.empty()) {
    std::cout << "  no CUDA plan recorded (a CPU bundle, or one built before kiln recorded plans)\n";
    return;
  }
  for (const auto& [batch, p] : plans.items()) {
    const auto steps = p.value("steps", nlohmann::json::array());
    // window_conv: the view blocks run as window convs (older bundles: true/false for all).
    const nlohmann::json w = p.value("window_conv", nlohmann::json(false));
    std::string windows = w.is_boolean() ? (w.get<bool>() ? "on" : "off") : w.empty() ? "off" : "";
    for (const auto& b : w.is_array() ? w : nlohmann::json::array()) windows += (windows.empty() ? "" : ", ") + b.get<std::string>();
    std::cout << "  CUDA plan for batch " << batch << " (" << gpu << "): " << steps.size() << " steps, arena "
              << p.value("arena_bytes", 0) << " bytes, workspace " << p.value("workspace_bytes", 0) << " bytes, window convs "
              << (w.is_array() && !w.empty() ? cat("in ", w.size(), " blocks (", windows, ")") : windows) << ", channel views "
              << (p.value("channel_views", false) ? "on" : "off") << "\n";
    // The side lane's steps (parse_tactics_record checked the indices): "[side lane k]" after their kernel.
    std::map<size_t, std::string> side;
    const auto runs = p.value("side_lane", nlohmann::json::array());
    for (size_t r = 0; r < runs.size(); ++r)
      for (const auto& k : runs[r]["steps"])
        side[k.get<size_t>()] = cat("  [side lane ", r, ": forked before step ", runs[r]["fork"].get<size_t>(),
                                    ", joined before step ", runs[r]["join"].get<size_t>(), "]");
    if (!runs.empty()) std::cout << "  side lane: " << runs.size() << " runs on a second stream\n";
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& st = steps[i];
      if (st.is_array() && st.size() == 2 && st[0].is_string() && st[1].is_string())
        std::cout << "    " << std::left << std::setw(44) << st[0].get<std::string>() << std::right << st[1].get<std::string>()
                  << (side.count(i) ? side[i] : "") << "\n";
    }
  }
}

// Every output's type, "f32[1,5]" or "f32[1,5], i64[1,5]" (top_k).
std::string output_types(const Graph& g, const Node& n) {
  std::string s;
  for (int o : n.outputs) s += (s.empty() ? "" : ", ") + (dtype_name(g.values[o].dtype) + shape_str(g.values[o].shape));
  return s;
}

}  // namespace

void add_inspect(CLI::App& app) {
  struct Opts {
    std::string backend;
    std::string bundle;
    bool json = false, graph = false, plan = false, scales = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("inspect", "Show a bundle's header, sections, layers, precisions and sizes");
  sub->add_option("bundle", o->bundle, "Bundle file")->required();
  add_load_backend_option(sub, o->backend);
  sub->add_flag("--json", o->json, "JSON output");
  sub->add_flag("--graph", o->graph, "Print the graph in kiln's text IR");
  sub->add_flag("--plan", o->plan, "Print the CUDA plan recorded per batch (every step and its kernel or tactic)");
  sub->add_flag("--scales", o->scales,
                "Print every quantization scale as JSON: each 8-bit weight's per-channel scales and each 8-bit activation's");
  sub->callback([o] {
    // Inspecting needs no GPU: a CUDA bundle is opened through the CPU backend
    // unless --backend cuda asks for the GPU (its memory plan is then the GPU's).
    auto engine = Engine::load(o->bundle, LoadOptions{o->backend.empty() ? "cpu" : o->backend, &std::cerr});
    const auto& e = engine->impl();
    if (o->scales) {  // from graph.json, where the engine reads them
      nlohmann::json weights = nlohmann::json::object(), activations = nlohmann::json::object();
      for (const Value& v : e.graph.values) {
        if (!v.quant) continue;
        (v.constant ? weights : activations)[v.name] = quant_to_json(*v.quant);
      }
      std::cout << nlohmann::json{{"weights", weights}, {"activations", activations}}.dump(1) << "\n";
      return;
    }
    auto mem = engine->create_context()->memory();
    // Tactics recorded in the bundle (CUDA builds): node name -> tactic, per GPU section.
    std::map<std::string, std::string> tactic_of;
    std::string tactic_gpu;
    nlohmann::json plans = nlohmann::json::object();  // batch -> the recorded CUDA plan
    for (const auto& sec : e.bundle.section_names()) {
      if (sec.rfind("tactics.", 0) != 0) continue;
      const nlohmann::json t = parse_tactics_record(e.bundle.section_text(sec), o->bundle + ": " + sec);
      if (!t.contains("layers")) continue;
      tactic_gpu = t.value("key", nlohmann::json::object()).value("gpu", sec);
      if (t.contains("batches") && t["batches"].is_object()) {
        std::string built;
        for (const auto& [b, v] : t["batches"].items()) {
          built += (built.empty() ? "" : ", ") + b;
          if (v.is_object() && v.contains("plan") && v["plan"].is_object()) plans[b] = v["plan"];
        }
        tactic_gpu += " for batch " + built + " (first shown)";
      }
      for (const auto& [name, v] : t["layers"].items())
        if (v.is_object() && v.contains("tactic") && v["tactic"].is_string()) tactic_of[name] = v["tactic"].get<std::string>();
    }
    // Input adds and channel views are fusion marks in the graph (both
    // backends read them). The CPU backend takes every marked view, so they
    // are shown for it; the CUDA backend decides per batch whether to use
    // them, recorded in its plan (--plan).
    ChannelViews views;
    const cpu::PrologueAdds adds = cpu::plan_prologue_adds(e.graph);
    if (e.backend == "cpu") {
      views = plan_channel_views(e.graph);
    } else {
      views.parent.assign(e.graph.values.size(), -1);
      views.channel_offset.assign(e.graph.values.size(), 0);
    }
    std::map<std::string, int> ops;
    for (const auto& n : e.graph.nodes) ++ops[op_name(n.op)];
    size_t weight_bytes = 0;
    for (const auto& v : e.graph.values)
      if (v.constant) weight_bytes += v.constant->nbytes();
    if (o->json) {
      nlohmann::json layers = nlohmann::json::array();
      for (size_t i = 0; i < e.graph.nodes.size(); ++i) {
        const Node& n = e.graph.nodes[i];
        const Value& out = e.graph.values[n.outputs[0]];
        nlohmann::json outs = nlohmann::json::array();  // every output; dtype and shape above are the first's
        for (int o : n.outputs)
          outs.push_back({{"name", e.graph.values[o].name}, {"dtype", dtype_name(e.graph.values[o].dtype)},
                          {"shape", e.graph.values[o].shape}});
        layers.push_back({{"name", n.name}, {"op", op_name(n.op)}, {"fused", fused(e.graph, n, views, adds, i)},
                          {"dtype", dtype_name(out.dtype)}, {"shape", out.shape}, {"outputs", outs}});
        if (tactic_of.count(n.name)) layers.back()["tactic"] = tactic_of[n.name];
      }
      nlohmann::json sections = nlohmann::json::object();
      for (const auto& s : e.bundle.section_names()) sections[s] = e.bundle.section(s).size;
      nlohmann::json j = {{"header", e.bundle.header()},
                          {"section_bytes", sections},
                          {"precision", e.precision},
                          {"nodes", e.graph.nodes.size()},
                          {"op_counts", ops},
                          {"weight_bytes", weight_bytes},
                          {"views", {{"slices_as_views", views.slices_as_views},
                                     {"concat_inputs_in_place", views.concat_inputs_in_place},
                                     {"concat_inputs_copied", views.concat_inputs_copied},
                                     {"adds_in_conv_prologue", adds.count}}},
                          {"memory", {{"arena_bytes", mem.arena_bytes}, {"naive_bytes", mem.naive_bytes}}},
                          {"layers", layers},
                          {"plans", plans},
                          {"runtime", nlohmann::json::parse(e.runtime_text)},
                          {"provenance", e.provenance}};
      std::cout << j.dump(2) << "\n";
      return;
    }
    const auto& info = e.bundle.info();
    std::cout << o->bundle << ": kiln bundle format " << info.format << ", built by kiln " << info.kiln_version << "\n"
              << "  family " << info.family << ", task " << info.task << ", backend " << info.backend << ", precision "
              << e.precision << "\n  sections:\n";
    for (const auto& s : e.bundle.section_names())
      std::cout << "    " << std::left << std::setw(20) << s << std::right << std::setw(12) << e.bundle.section(s).size
                << " bytes\n";
    for (const auto& t : engine->inputs()) std::cout << "  input  " << t.name << " f32" << shape_str(t.shape) << "\n";
    for (const auto& t : engine->outputs()) std::cout << "  output " << t.name << " f32" << shape_str(t.shape) << "\n";
    std::cout << "  weights " << weight_bytes << " bytes; activation arena " << mem.arena_bytes << " bytes (naive sum "
              << mem.naive_bytes << ", " << std::fixed << std::setprecision(1)
              << (mem.arena_bytes ? static_cast<double>(mem.naive_bytes) / mem.arena_bytes : 0.0) << "x less)\n";
    if (!e.reference.empty()) {
      std::cout << "  plain reference path (CPU) for:";
      for (const auto& r : e.reference) std::cout << " " << r;
      std::cout << "\n";
    }
    std::cout << "  max batch " << e.max_batch << "; engine switches";
    if (e.switches.all_auto()) std::cout << " all auto";
    const nlohmann::json switches = e.switches.to_json();  // named: items() of a temporary would dangle
    for (const auto& [k, v] : switches.items())
      if (v != "auto") std::cout << " " << k << "=" << v.get<std::string>();
    std::cout << "\n";
    if (!tactic_gpu.empty()) std::cout << "  tactics selected on " << tactic_gpu << " (last column)\n";
    std::cout << "  " << e.graph.nodes.size() << " layers:";
    for (const auto& [op, n] : ops) std::cout << " " << op << "=" << n;
    std::cout << "\n";
    for (size_t i = 0; i < e.graph.nodes.size(); ++i) {
      const Node& n = e.graph.nodes[i];
      std::cout << "    " << std::left << std::setw(28) << n.name << std::setw(16) << op_name(n.op) << std::setw(36)
                << fused(e.graph, n, views, adds, i) << std::setw(26) << output_types(e.graph, n) << std::right
                << (tactic_of.count(n.name) ? "  " + tactic_of[n.name] : "") << "\n";
    }
    if (o->plan) print_plans(plans, tactic_gpu);
    if (o->graph) std::cout << print_graph(e.graph);
  });
}

}  // namespace kiln::cli
