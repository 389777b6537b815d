// Runs the `kiln` binary for CLI tests: exit code, stdout and stderr apart
// (progress bars and notices belong on stderr, results on stdout).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln::testing {

struct CliRun {
  int code = -1;  // exit status, -1 if the process did not exit normally
  std::string out, err;
  std::string all() const { return out + err; }
};

// `env`: "VAR=value ..." put in front of the command with env(1).
inline CliRun run_kiln(const std::string& args, const std::string& env = "") {
  static int calls = 0;
  const std::filesystem::path base = std::filesystem::temp_directory_path() /
                                     ("kiln_cli_" + std::to_string(::getpid()) + "_" + std::to_string(++calls));
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(KILN_BINARY) + " " + args + " > " +
                          base.string() + ".out 2> " + base.string() + ".err";
  const int status = std::system(cmd.c_str());
  std::ifstream o(base.string() + ".out"), e(base.string() + ".err");
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string((std::istreambuf_iterator<char>(o)), {}),
           std::string((std::istreambuf_iterator<char>(e)), {})};
  std::filesystem::remove(base.string() + ".out");
  std::filesystem::remove(base.string() + ".err");
  return r;
}

}  // namespace kiln::testing
