#!/usr/bin/env bash
# Installs what kiln needs on a fresh Debian 12 machine (as root) and
# configures + builds it. Idempotent: re-running only builds what changed.
#   tools/setup.sh [release|debug|sanitize|tsan]   (CMakePresets.json)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"

need_pkgs=()
for p in build-essential cmake ninja-build ccache pkg-config libcli11-dev nlohmann-json3-dev libgtest-dev \
         libopenblas-dev libjpeg-dev libpng-dev libssl-dev zstd python3; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if ((${#need_pkgs[@]})); then
  echo "setup: installing ${need_pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# cuDNN's C++ frontend is header-only and not packaged for Debian; take the
# headers from its PyPI wheel (nvidia-cudnn-frontend). Only needed when the
# CUDA toolkit is present; without it kiln builds CPU-only.
fe=third_party/cudnn_frontend/include
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  if [ ! -f "$fe/cudnn_frontend.h" ]; then
    echo "setup: fetching cuDNN frontend headers (nvidia-cudnn-frontend==1.32.0 from PyPI)" >&2
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --only-binary=:all: nvidia-cudnn-frontend==1.32.0 -d "$tmp" 2>/dev/null ||
       python3 -m pip download -q --no-deps nvidia-cudnn-frontend==1.32.0 -d "$tmp"; then
      mkdir -p third_party/cudnn_frontend
      python3 - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith("include/"):
            z.extract(n, "third_party/cudnn_frontend")
PY
    else
      echo "setup: could not fetch the cuDNN frontend; building CPU-only" >&2
    fi
    rm -rf "$tmp"
  fi
  # CUTLASS (header-only, used by the sm90 FP8 GEMM fp8_gemm_sm90*.cu and the
  # sm90 conv conv_sm90*.cu): the headers of its PyPI wheel (nvidia-cutlass,
  # cutlass_library/source/include, and tools/util/include for the conv's
  # cutlass/util/packed_stride.hpp), both unpacked into one include folder.
  # Without them those kernels report no configurations and the rest builds as before.
  ct=third_party/cutlass/include
  if [ ! -f "$ct/cutlass/cutlass.h" ] || [ ! -f "$ct/cutlass/util/packed_stride.hpp" ]; then
    echo "setup: fetching CUTLASS headers (nvidia-cutlass==4.2.0.0 from PyPI)" >&2
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --only-binary=:all: nvidia-cutlass==4.2.0.0 -d "$tmp" 2>/dev/null ||
       python3 -m pip download -q --no-deps nvidia-cutlass==4.2.0.0 -d "$tmp"; then
      python3 - "$tmp" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
pres = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        pre = next((p for p in pres if n.startswith(p)), None)
        if pre and not n.endswith("/"):
            out = os.path.join("third_party/cutlass/include", n[len(pre):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as src, open(out, "wb") as dst:
                dst.write(src.read())
PY
    else
      echo "setup: could not fetch CUTLASS; the sm90 FP8 GEMM and conv are left out" >&2
    fi
    rm -rf "$tmp"
  fi
  export PATH="/usr/local/cuda/bin:$PATH"
fi

cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j"$(nproc)"
