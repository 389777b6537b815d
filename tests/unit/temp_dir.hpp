// Temporary directories and file writing shared by the checkpoint tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace kiln::testing {

namespace fs = std::filesystem;

// A fresh, uniquely named directory per test (mkdtemp), removed with all it
// holds at scope exit, so "nothing left behind" can be checked exactly.
class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "kiln_test_XXXXXX").string();
    if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  // Names directly inside, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path_)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

 private:
  fs::path path_;
};

// Unsets environment variables for one test (by default those that locate
// the Hugging Face cache) and restores them afterwards; set() changes one.
class EnvGuard {
 public:
  EnvGuard(std::initializer_list<const char*> vars = {"HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "HOME"}) {
    for (const char* k : vars) {
      const char* v = std::getenv(k);
      saved_.emplace_back(k, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(k);
    }
  }
  ~EnvGuard() {
    for (const auto& [k, v] : saved_) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  void set(const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

inline void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}


// Runs `fn`, expecting Error(Input) whose message contains every needle.
template <typename Fn>
::testing::AssertionResult throws_input(Fn&& fn, std::vector<std::string> needles,
                                        ErrorKind kind = ErrorKind::Input) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.kind() != kind) return ::testing::AssertionFailure() << "wrong kind " << int(e.kind()) << ": " << e.what();
    for (const auto& n : needles)
      if (std::string(e.what()).find(n) == std::string::npos)
        return ::testing::AssertionFailure() << "message '" << e.what() << "' lacks '" << n << "'";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "non-kiln exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception";
}

}  // namespace kiln::testing
