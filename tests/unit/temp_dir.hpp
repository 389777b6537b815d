// Temporary directories and file writing shared by the checkpoint tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace kiln::testing {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    std::random_device rd;
    path_ = fs::temp_directory_path() / cat("kiln_ckpt_", ::getpid(), "_", counter++, "_", rd());
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
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
