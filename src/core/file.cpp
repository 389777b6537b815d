#include "core/file.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.hpp"

namespace kiln {

namespace {
struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr && size) munmap(addr, size);
  }
};
}  // namespace

Blob map_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_input(path.string(), ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_input(path.string(), ": not a regular file");
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size) {
    m->addr = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->addr == MAP_FAILED) {
      m->addr = nullptr;
      ::close(fd);
      fail_input(path.string(), ": mmap failed: ", std::strerror(errno));
    }
  }
  ::close(fd);
  Blob b;
  b.data = static_cast<const uint8_t*>(m->addr);
  b.size = m->size;
  b.owner = m;
  return b;
}

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  Blob b = map_file(path);
  return std::vector<uint8_t>(b.data, b.data + b.size);
}

std::array<uint8_t, 32> sha256(const void* data, size_t size) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  if (!EVP_Digest(data, size, out.data(), &len, EVP_sha256(), nullptr) || len != 32)
    fail_runtime("sha256 failed");
  return out;
}

std::string sha256_hex(const void* data, size_t size) {
  auto d = sha256(data, size);
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t c : d) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

std::string sha256_file_hex(const std::filesystem::path& path) {
  Blob b = map_file(path);
  return sha256_hex(b.data, b.size);
}

void write_all(std::FILE* f, const void* data, size_t size) {
  if (size && std::fwrite(data, 1, size, f) != size) fail_runtime("short write: ", std::strerror(errno));
}

void write_file_atomic(const std::filesystem::path& target, const std::function<void(std::FILE*)>& write) {
  std::filesystem::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  std::random_device rd;
  std::filesystem::path tmp = dir / cat(".", target.filename().string(), ".tmp", rd());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail_input(target.string(), ": cannot write: ", std::strerror(errno));
  try {
    write(f);
    if (std::fflush(f) != 0 || fsync(fileno(f)) != 0) fail_runtime(target.string(), ": flush failed: ", std::strerror(errno));
    std::fclose(f);
    f = nullptr;
    std::filesystem::rename(tmp, target);
  } catch (...) {
    if (f) std::fclose(f);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace kiln
