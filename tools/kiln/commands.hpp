// Each subcommand lives in its own file and registers itself on the app.
#pragma once
#include <CLI/CLI.hpp>

namespace kiln::cli {

void add_build(CLI::App& app);
void add_classify(CLI::App& app);
void add_run(CLI::App& app);
void add_eval(CLI::App& app);
void add_inspect(CLI::App& app);
void add_version(CLI::App& app);
void add_bench(CLI::App& app);

}  // namespace kiln::cli
