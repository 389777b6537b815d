#include "core/npy.hpp"

#include <bit>
#include <cstring>

#include "core/error.hpp"
#include "core/file.hpp"

namespace kiln {

// npy data is little-endian and is used in place.
static_assert(std::endian::native == std::endian::little, "kiln assumes a little-endian host");

namespace {

constexpr char kNpyMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr size_t kNpyAlign = 64;

struct DescrEntry {
  const char* descr;
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"<f4", DType::F32}, {"<f2", DType::F16}, {"<i8", DType::I64}, {"<i4", DType::I32}, {"|u1", DType::U8},
};

struct NpyLayout {
  DType dtype = DType::F32;
  Shape shape;
  size_t data_offset = 0;
  size_t nbytes = 0;
};

// Strict recursive-descent parser for the one dict shape numpy writes:
// {'descr': STR, 'fortran_order': BOOL, 'shape': TUPLE_OF_INTS} with keys
// in any order, optional trailing comma and arbitrary whitespace. Anything
// else is rejected rather than guessed at.
class HeaderParser {
 public:
  HeaderParser(const std::string& where, const char* s, size_t n) : where_(where), s_(s), n_(n) {}

  void parse(std::string& descr, bool& fortran, Shape& shape) {
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_ws();
    expect('{');
    skip_ws();
    while (!at('}')) {
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (seen_descr) fail("duplicate key 'descr'");
        seen_descr = true;
        if (!at('\'') && !at('"')) fail("'descr' must be a string (structured dtypes are not supported)");
        descr = parse_string();
      } else if (key == "fortran_order") {
        if (seen_fortran) fail("duplicate key 'fortran_order'");
        seen_fortran = true;
        fortran = parse_bool();
      } else if (key == "shape") {
        if (seen_shape) fail("duplicate key 'shape'");
        seen_shape = true;
        shape = parse_shape();
      } else {
        fail(cat("unknown key '", key, "'"));
      }
      skip_ws();
      if (at(',')) {
        ++i_;
        skip_ws();
      } else if (!at('}')) {
        fail("expected ',' or '}'");
      }
    }
    ++i_;
    skip_ws();
    if (i_ != n_) fail("unexpected characters after the header dict");
    if (!seen_descr) fail("missing key 'descr'");
    if (!seen_fortran) fail("missing key 'fortran_order'");
    if (!seen_shape) fail("missing key 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    fail_input(where_, ": bad npy header at character ", i_, ": ", what);
  }
  bool at(char c) const { return i_ < n_ && s_[i_] == c; }
  void expect(char c) {
    if (!at(c)) fail(cat("expected '", c, "'"));
    ++i_;
  }
  void skip_ws() {
    while (i_ < n_ && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  std::string parse_string() {
    if (!at('\'') && !at('"')) fail("expected a quoted string");
    const char q = s_[i_++];
    const size_t start = i_;
    while (i_ < n_ && s_[i_] != q) {
      // Escapes never occur in the keys and dtypes numpy writes.
      if (s_[i_] == '\\' || s_[i_] == '\n') fail("unsupported character in string");
      ++i_;
    }
    if (i_ == n_) fail("unterminated string");
    return std::string(s_ + start, s_ + i_++);
  }
  bool parse_bool() {
    auto word = [&](const char* w) {
      const size_t len = std::strlen(w);
      if (n_ - i_ >= len && std::memcmp(s_ + i_, w, len) == 0) {
        i_ += len;
        return true;
      }
      return false;
    };
    if (word("True")) return true;
    if (word("False")) return false;
    fail("expected True or False");
  }
  int64_t parse_int() {
    if (i_ >= n_ || s_[i_] < '0' || s_[i_] > '9') fail("expected a non-negative integer");
    int64_t v = 0;
    while (i_ < n_ && s_[i_] >= '0' && s_[i_] <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[i_] - '0', &v))
        fail("dimension too large");
      ++i_;
    }
    if (at('L')) ++i_;  // Python 2 numpy wrote longs as 3L
    return v;
  }
  // () | (n,) | (n, m[, ...][,]) — "(n)" is an int in Python, not a tuple.
  Shape parse_shape() {
    Shape shape;
    expect('(');
    skip_ws();
    if (at(')')) {
      ++i_;
      return shape;
    }
    for (;;) {
      shape.push_back(parse_int());
      skip_ws();
      if (at(')')) {
        if (shape.size() == 1) fail("a 1-D shape needs a trailing comma, as in (5,)");
        ++i_;
        return shape;
      }
      expect(',');
      skip_ws();
      if (at(')')) {
        ++i_;
        return shape;
      }
    }
  }

  const std::string& where_;
  const char* s_;
  size_t n_;
  size_t i_ = 0;
};

DType dtype_from_descr(const std::string& where, const std::string& descr) {
  for (const auto& d : kDescrs)
    if (descr == d.descr) return d.dtype;
  if (!descr.empty() && descr[0] == '>')
    fail_input(where, ": big-endian npy data ('", descr, "') is not supported; save it with arr.astype(arr.dtype.newbyteorder('<'))");
  if (descr == "|i1") fail_input(where, ": npy dtype int8 ('|i1') has no kiln dtype");
  fail_input(where, ": unsupported npy dtype '", descr, "' (supported: '<f4', '<f2', '<i8', '<i4', '|u1')");
}

NpyLayout parse_npy(const uint8_t* p, size_t size, const std::string& where) {
  if (size < 10 || std::memcmp(p, kNpyMagic, 6) != 0) fail_input(where, ": not an npy file (bad magic)");
  const int major = p[6], minor = p[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail_input(where, ": unsupported npy version ", major, ".", minor, " (supported: 1.0, 2.0, 3.0)");
  size_t prefix = 10, header_len = 0;
  if (major == 1) {
    header_len = static_cast<size_t>(p[8]) | static_cast<size_t>(p[9]) << 8;
  } else {
    if (size < 12) fail_input(where, ": npy file truncated inside the header length");
    prefix = 12;
    header_len = static_cast<size_t>(p[8]) | static_cast<size_t>(p[9]) << 8 | static_cast<size_t>(p[10]) << 16 |
                 static_cast<size_t>(p[11]) << 24;
  }
  if (header_len > size - prefix)
    fail_input(where, ": npy header length ", header_len, " runs beyond the end of the file (", size, " bytes)");

  std::string descr;
  bool fortran = false;
  NpyLayout layout;
  HeaderParser(where, reinterpret_cast<const char*>(p + prefix), header_len).parse(descr, fortran, layout.shape);
  layout.dtype = dtype_from_descr(where, descr);
  if (fortran) fail_input(where, ": fortran_order True is not supported; save np.ascontiguousarray(arr)");

  uint64_t n = dtype_size(layout.dtype);
  for (int64_t d : layout.shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      fail_input(where, ": npy shape ", shape_str(layout.shape), " is too large");
  layout.data_offset = prefix + header_len;
  const size_t have = size - layout.data_offset;
  if (n != have)
    fail_input(where, ": npy data is ", have, " bytes but shape ", shape_str(layout.shape), " of ", descr, " needs ",
               n, " (file truncated or damaged)");
  layout.nbytes = static_cast<size_t>(n);
  return layout;
}

}  // namespace

HostTensor read_npy(const std::filesystem::path& path) {
  Blob file = map_file(path);
  NpyLayout l = parse_npy(file.data, file.size, path.string());
  HostTensor t;
  t.dtype = l.dtype;
  t.shape = l.shape;
  const uint8_t* data = file.data + l.data_offset;
  // Kernels read the data as typed arrays; keep the zero-copy view only
  // when that is safe.
  if (reinterpret_cast<uintptr_t>(data) % 16 == 0) {
    t.blob.owner = file.owner;
    t.blob.data = data;
    t.blob.size = l.nbytes;
  } else {
    t.blob = Blob::copy_of(data, l.nbytes);
  }
  return t;
}

HostTensor read_npy_bytes(const uint8_t* data, size_t size, const std::string& name_for_errors) {
  if (!data && size) fail_runtime(name_for_errors, ": null data");
  NpyLayout l = parse_npy(data, size, name_for_errors);
  HostTensor t;
  t.dtype = l.dtype;
  t.shape = l.shape;
  t.blob = Blob::copy_of(data + l.data_offset, l.nbytes);
  return t;
}

std::vector<uint8_t> encode_npy(const HostTensor& t) {
  const char* descr = nullptr;
  for (const auto& d : kDescrs)
    if (d.dtype == t.dtype) descr = d.descr;
  if (!descr) fail_runtime("npy has no dtype for ", dtype_name(t.dtype), " tensors");
  for (int64_t d : t.shape)
    if (d < 0) fail_runtime("cannot write a tensor of shape ", shape_str(t.shape), " to npy");
  if (t.blob.size < t.nbytes())
    fail_runtime("tensor of shape ", shape_str(t.shape), " has only ", t.blob.size, " bytes, needs ", t.nbytes());

  // Python tuple repr: (), (5,), (2, 3, 4)
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  if (t.shape.size() == 1) shape += ",";
  shape += ")";
  std::string header = cat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  // Pad with spaces, end with '\n' (as numpy does) so the data is 64-aligned.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((kNpyAlign - unpadded % kNpyAlign) % kNpyAlign, ' ');
  header += '\n';
  if (header.size() > 0xffff) fail_runtime("npy header too long for version 1.0 (shape ", shape_str(t.shape), ")");

  std::vector<uint8_t> out(10 + header.size() + t.nbytes());
  std::memcpy(out.data(), kNpyMagic, 6);
  out[6] = 1;
  out[7] = 0;
  out[8] = static_cast<uint8_t>(header.size() & 0xff);
  out[9] = static_cast<uint8_t>(header.size() >> 8);
  std::memcpy(out.data() + 10, header.data(), header.size());
  if (t.nbytes()) std::memcpy(out.data() + 10 + header.size(), t.blob.data, t.nbytes());
  return out;
}

void write_npy(const std::filesystem::path& path, const HostTensor& t) {
  const std::vector<uint8_t> bytes = encode_npy(t);
  write_file_atomic(path, [&](std::FILE* f) { write_all(f, bytes.data(), bytes.size()); });
}

}  // namespace kiln
