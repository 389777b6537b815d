// kiln command line. Exit codes: 0 ok, 1 usage, 2 input error, 3 runtime error.
#include <iostream>

#include "commands.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kiln: build Hugging Face vision checkpoints into inference bundles and run them"};
  app.require_subcommand(1);
  kiln::cli::add_build(app);
  kiln::cli::add_classify(app);
  kiln::cli::add_detect(app);
  kiln::cli::add_run(app);
  kiln::cli::add_eval(app);
  kiln::cli::add_inspect(app);
  kiln::cli::add_version(app);
  kiln::cli::add_bench(app);
  kiln::cli::add_study(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 1;
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
