#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (ctest). GPU tests
# skip cleanly where no GPU is visible; tools/gpu/run_gpu_tests.sh runs them
# on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh release
ctest --preset release -j"$(nproc)" --timeout 900
