// kiln_ops_tests' main: the harness's own flags, then GoogleTest's.
//   --perf            also time every case per backend (median of --perf-runs runs) and print it
//   --perf-runs=N     runs per timing (default 20)
//   --cuda-opt-level=N  opt level of the CUDA engines (default 3, what `kiln build` uses)
//   --list-cases      print every case and the case count per op and dtype, then exit
//   --errors          after the tests, print the largest error per backend, op and dtype
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "core/error.hpp"
#include "op_harness.hpp"

namespace kiln::ops {

std::map<std::string, std::pair<double, double>>& error_log() {
  static std::map<std::string, std::pair<double, double>> log;  // "backend group dtype" -> (max error, max error/limit)
  return log;
}

namespace {

const char* expect_name(const Declared& d) {
  switch (d.expect) {
    case Expect::Match: return "match";
    case Expect::Refuses: return "refuses";
    case Expect::WrongResult: return "wrong";
    case Expect::NotLowered: return "not-lowered";
    default: return "?";
  }
}

void list_cases() {
  std::map<std::string, std::map<std::string, int>> counts;  // group -> dtype -> cases
  std::printf("%-60s %-22s %-10s %-8s %-8s\n", "case", "measure", "limit", "cpu", "cuda");
  for (const OpCase& c : all_cases()) {
    ++counts[c.group][dtype_name(c.dtype)];
    std::printf("%-60s %-22s %-10g %-8s %-8s%s%s%s\n", c.name.c_str(), measure_name(c.limit.measure), c.limit.limit,
                expect_name(c.cpu), expect_name(c.cuda),
                c.cuda.limit ? cat("  cuda limit ", measure_name(c.cuda.limit->measure), " ", c.cuda.limit->limit).c_str() : "",
                c.cuda.why.empty() ? "" : "  cuda: ", c.cuda.why.c_str());
  }
  std::printf("\n| op / group | f32 | f16 | bf16 |\n|---|---|---|---|\n");
  int total = 0;
  for (const auto& [group, per] : counts) {
    auto n = [&](const char* t) { return per.count(t) ? per.at(t) : 0; };
    std::printf("| %s | %d | %d | %d |\n", group.c_str(), n("f32"), n("f16"), n("bf16"));
    total += n("f32") + n("f16") + n("bf16");
  }
  std::printf("\n%d cases\n", total);
  for (kiln::Op op : kNotLoweredOnCuda) {
    int n = 0;
    for (const OpCase& c : all_cases()) n += c.cuda.expect == Expect::NotLowered && c.group == kiln::op_name(op);
    std::printf("not lowered on CUDA yet: %s (%d cases skipped by OpCuda)\n", kiln::op_name(op), n);
  }
}

}  // namespace
}  // namespace kiln::ops

int main(int argc, char** argv) {
  using namespace kiln::ops;
  bool list = false, errors = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--perf") options().perf = true;
    else if (a.rfind("--perf-runs=", 0) == 0) options().perf_runs = std::max(1, std::atoi(a.c_str() + 12));
    else if (a.rfind("--cuda-opt-level=", 0) == 0) options().cuda_opt_level = std::atoi(a.c_str() + 17);
    else if (a.rfind("--fp8-fusion=", 0) == 0) {
      const std::string v = a.substr(13);
      if (v != "auto" && v != "on" && v != "off" && v != "cutlass") {
        std::fprintf(stderr, "--fp8-fusion takes auto, on, off or cutlass, not '%s'\n", v.c_str());
        return 2;
      }
      options().fp8_fusion = v == "on" ? 1 : v == "off" ? -1 : v == "cutlass" ? 2 : 0;
    } else if (a == "--list-cases") list = true;
    else if (a == "--errors") errors = true;
    else argv[kept++] = argv[i];
  }
  argc = kept;
  if (list) {
    list_cases();
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (errors) {
    std::printf("\n%-44s %-14s %s\n", "backend op dtype", "max error", "max error/limit");
    for (const auto& [key, e] : error_log()) std::printf("%-44s %-14.3g %.3f\n", key.c_str(), e.first, e.second);
  }
  return rc;
}
