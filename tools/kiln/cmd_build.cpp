#include <iostream>
#include <nlohmann/json.hpp>

#include "bundle/builder.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "ir/node_select.hpp"
#include "core/progress.hpp"

namespace kiln::cli {

void add_build(CLI::App& app) {
  struct Opts {
    BuildOptions b;
    std::string out, precision = "fp32", enable, disable, reference;
    std::vector<int> batches;
    bool json = false, quiet = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("build", "Build a checkpoint (directory or HF id in the local cache) into a .bundle");
  sub->add_option("model", o->b.model, "Local directory with config.json + *.safetensors, or a Hugging Face id")->required();
  sub->add_option("-o,--output", o->out, "Output .bundle path")->required();
  sub->add_option("--revision", o->b.revision, "Hugging Face revision (branch, tag or commit)");
  sub->add_option("--precision", o->precision, "fp32 | fp16 | bf16")->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  sub->add_option("--backend", o->b.backend, "cpu, or cuda (tactics are selected on this machine's GPU)")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--batch", o->batches,
                  "Batch size(s) the engine is planned (and timed) for, e.g. 1,8,32; the first is the graph's")
      ->delimiter(',');
  sub->add_option("--opt-level", o->b.opt_level, "0..5 (tactic search effort)");
  sub->add_option("--max-batch", o->b.max_batch, "Largest batch the engine accepts at run time (default 4096)");
  sub->add_option("--enable", o->enable, "Engine switches to force on, comma-separated (" + switch_names() + ")");
  sub->add_option("--disable", o->disable, "Engine switches to force off, comma-separated (recorded in the bundle)");
  sub->add_option("--reference", o->reference,
                  "Layer globs (names or ops, e.g. 'layer2.*,linear') run by the plain reference (CUDA: on the host, in the stream; debugging)");
  sub->add_option("--tactic-cache", o->b.tactic_cache,
                  "CUDA tactic cache file read and written while timing, or 'off' (default ~/.cache/kiln/tactics.json)");
  sub->add_flag("--verify", o->b.verify, "Run the IR verifier after every pass");
  sub->add_flag("--tf32", o->b.allow_tf32, "CUDA fp32 engines: allow TF32 tensor cores (off by default: it changes results)");
  sub->add_flag("--json", o->json, "Print a JSON summary on stdout");
  sub->add_flag("--quiet", o->quiet, "No progress lines or bar on stderr");
  sub->callback([o] {
    o->b.precision = o->precision == "fp16" ? DType::F16 : o->precision == "bf16" ? DType::BF16 : DType::F32;
    o->b.log = o->quiet ? nullptr : &std::cerr;
    // Tactic timing (CUDA, opt level >= 3) is the long part of a build: a bar
    // per graph node, on a terminal only.
    ProgressBar bar("tactics", 0, o->b.backend == "cuda" && o->b.opt_level >= 3 && stderr_is_tty() && !o->json && !o->quiet,
                    std::cerr, "node");
    if (bar.enabled())
      o->b.progress = [&bar](int64_t done, int64_t total) {
        bar.set_total(total);
        bar.update(done);
      };
    if (!o->batches.empty()) {
      o->b.batch = o->batches[0];
      o->b.batches.assign(o->batches.begin() + 1, o->batches.end());
    }
    o->b.switches.set_list(o->enable, true);
    o->b.switches.set_list(o->disable, false);
    if (o->b.tactic_cache == "off") o->b.tactic_cache.clear();
    o->b.reference = split_patterns(o->reference);
    BuildSummary s = build_bundle(o->b, o->out);
    bar.finish();
    if (o->json) {
      nlohmann::json j = {{"bundle", o->out},          {"family", s.family},           {"model_dir", s.model_dir},
                          {"nodes_before", s.nodes_before}, {"nodes_after", s.nodes_after}, {"op_counts", s.op_counts},
                          {"bundle_bytes", s.bundle_bytes}, {"seconds", s.seconds}};
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "built " << o->out << ": family " << s.family << ", " << s.nodes_after << " nodes, "
                << s.bundle_bytes << " bytes, " << s.seconds << " s\n";
    }
  });
}

}  // namespace kiln::cli
