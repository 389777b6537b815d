// libFuzzer driver for one entry point of entry_points.hpp (KILN_FUZZ_ENTRY,
// set per target by tests/fuzz/CMakeLists.txt). kiln::Error is the expected
// way to reject an input; everything else escapes and is reported.
#include <cstddef>
#include <cstdint>

#include "kiln/kiln.hpp"
#include "tests/fuzz/entry_points.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    kiln::fuzz::KILN_FUZZ_ENTRY(data, size);
  } catch (const kiln::Error&) {
  }
  return 0;
}
