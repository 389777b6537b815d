// Kernel names for people. CUTLASS kernels reach kiln's kernel listings
// (kernel_names.cpp, `kiln bench --profile`, `kiln study quant`) as mangled
// names thousands of characters long that the demangler does not take (and
// whose demangled form is all template arguments); they are shown as the few
// facts that tell two configurations apart. Other names pass unchanged.
#pragma once
#include <cctype>
#include <regex>
#include <string>
#include <vector>

namespace kiln {

inline std::string readable_kernel_name(const std::string& name) {
  if (name.rfind("_ZN7cutlass", 0) != 0) return name;
  std::vector<std::string> facts;
  std::smatch m;
  // The warpgroup MMA atom: shape and types (accumulator, A, B).
  static const std::regex mma("MMA_(\\d+x\\d+x\\d+)_([A-Z0-9]+?)_SS"),
      stages("MainloopSm90TmaGmmaWarpSpecialized(?:FP8)?ILi(\\d+)E"), schedule("KernelTmaWarpSpecialized(Cooperative|Pingpong)");
  if (std::regex_search(name, m, mma)) facts.push_back(m[1].str() + " " + m[2].str());
  if (std::regex_search(name, m, stages)) facts.push_back(m[1].str() + " stages");
  if (std::regex_search(name, m, schedule))
    facts.push_back(m[1].str() == "Cooperative" ? "cooperative" : "ping-pong");
  if (name.find("StreamK") != std::string::npos) facts.push_back("stream-K");
  // kiln's epilogue functor: a length-prefixed identifier after the namespace "fp8sm90".
  if (const auto at = name.find("fp8sm90"); at != std::string::npos) {
    size_t i = at + 7, len = 0;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && len < 1000) len = len * 10 + size_t(name[i++] - '0');
    if (len > 0 && i + len <= name.size()) facts.push_back(name.substr(i, len));
  }
  if (facts.empty()) return name;  // nothing recognised: as given (the demangler may do better)
  std::string out = name.find("GemmUniversal") != std::string::npos ? "cutlass GEMM sm90" : "cutlass kernel";
  for (size_t k = 0; k < facts.size(); ++k) out += (k ? ", " : " [") + facts[k];
  return out + "]";
}

}  // namespace kiln
