#!/usr/bin/env bash
# Installs what is missing, builds, and runs the tests (ctest). GPU tests
# skip cleanly where no GPU is visible; tools/gpu/run_gpu_tests.sh runs them
# on a GPU machine.
#   tools/test.sh            release preset: every test
#   tools/test.sh sanitize   CPU-only, AddressSanitizer + UBSan (UB aborts): every CPU test
#   tools/test.sh tsan       CPU-only, ThreadSanitizer: the multi-threaded tests (the tsan test preset's filter)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
case "$preset" in
  release | sanitize | tsan) ;;
  *) echo "usage: tools/test.sh [release|sanitize|tsan]" >&2; exit 1 ;;
esac
tools/setup.sh "$preset"
ctest --preset "$preset" -j"$(nproc)" --timeout 900
