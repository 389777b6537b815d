#include "core/file.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
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

Blob read_file_blob(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_input(path.string(), ": cannot open: ", std::strerror(errno));
  struct Fd {
    int fd;
    ~Fd() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail_input(path.string(), ": not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  // 64-byte alignment keeps the bundle's 64-byte aligned sections aligned in memory too.
  void* raw = size ? std::aligned_alloc(64, (size + 63) / 64 * 64) : nullptr;
  if (size && !raw) fail_runtime(path.string(), ": out of memory reading ", size, " bytes");
  std::shared_ptr<void> owner(raw, [](void* q) { std::free(q); });
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, static_cast<uint8_t*>(raw) + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_input(path.string(), ": read failed: ", std::strerror(errno));
    if (n == 0) fail_input(path.string(), ": file shrank while being read (", done, " of ", size, " bytes)");
    done += static_cast<size_t>(n);
  }
  char extra = 0;
  if (::read(fd, &extra, 1) > 0) fail_input(path.string(), ": file grew while being read (expected ", size, " bytes)");
  Blob b;
  b.data = static_cast<const uint8_t*>(raw);
  b.size = size;
  b.owner = owner;
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
