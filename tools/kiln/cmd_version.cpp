#include <iostream>
#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "bundle/bundle.hpp"
#include "commands.hpp"
#include "kiln/kiln.hpp"

namespace kiln::cli {

void add_version(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand("version", "Print kiln's version and the bundle format it writes");
  sub->add_flag("--json", *json, "JSON output");
  sub->callback([json] {
    const std::vector<std::string> backends = backend_registry().names();
    if (*json) {
      std::cout << nlohmann::json{{"kiln_version", version()}, {"bundle_format", kBundleFormat}, {"backends", backends}}.dump()
                << "\n";
    } else {
      std::cout << "kiln " << version() << " (bundle format " << kBundleFormat << ", backends:";
      for (const auto& b : backends) std::cout << " " << b;
      std::cout << ")\n";
    }
  });
}

}  // namespace kiln::cli
