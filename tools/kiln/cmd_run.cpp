#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"
#include "kiln/kiln.hpp"

namespace kiln::cli {

void add_run(CLI::App& app) {
  struct Opts {
    std::string backend;
    std::string bundle, out_dir;
    std::vector<std::string> inputs;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("run", "Run a bundle on raw tensors (.npy in, .npy out)");
  sub->add_option("bundle", o->bundle, "Bundle file")->required();
  add_load_backend_option(sub, o->backend);
  sub->add_option("--input", o->inputs, "NAME=FILE.npy (float32 or float16)")->required();
  sub->add_option("--output-dir", o->out_dir, "Directory for <output name>.npy files")->required();
  sub->callback([o] {
    auto engine = Engine::load(o->bundle, LoadOptions{o->backend, &std::cerr});
    std::vector<Tensor> inputs;
    for (const auto& spec : o->inputs) {
      auto eq = spec.find('=');
      if (eq == std::string::npos || eq == 0) fail_usage("--input expects NAME=FILE.npy, got '", spec, "'");
      HostTensor t = read_npy(spec.substr(eq + 1));
      if (t.dtype != DType::F32 && t.dtype != DType::F16)
        fail_input(spec.substr(eq + 1), ": dtype ", dtype_name(t.dtype), " given, engine inputs take f32 (or f16)");
      inputs.push_back({spec.substr(0, eq), t.shape, t.to_f32()});
    }
    // Compute everything before writing anything, so a failure leaves no files.
    auto outputs = engine->create_context()->run(inputs);
    std::filesystem::create_directories(o->out_dir);
    for (const auto& t : outputs) {
      auto path = std::filesystem::path(o->out_dir) / (t.name + ".npy");
      write_npy(path, HostTensor::from_f32(t.shape, t.data));
      std::cout << t.name << " " << shape_str(t.shape) << " -> " << path.string() << "\n";
    }
  });
}

}  // namespace kiln::cli
