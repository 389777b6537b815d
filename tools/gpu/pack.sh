#!/usr/bin/env bash
# Builds the CUDA-enabled kiln here and packs what must travel to the GPU
# machine into .gpu/ (git-ignored): the binaries (xz-compressed: the
# statically linked OpenBLAS makes them large) and the one shared library
# the GPU machine's Ubuntu lacks (libjpeg.so.62). Then run, on that machine,
#   tools/gpu/on_device.sh OUTDIR
# with .gpu carried along (the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
# KILN_PACK_BUILD: the build folder to pack (default build-cuda; the release
# preset's `build` works too when it was configured with the CUDA toolkit).
bdir=${KILN_PACK_BUILD:-build-cuda}
[ -d "$bdir" ] || cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$bdir" -j"$(nproc)"
rm -rf .gpu/pack && mkdir -p .gpu/pack/lib .gpu/pack/bin
cp "$bdir"/kiln "$bdir"/kiln_tests "$bdir"/kiln_gpu_tests "$bdir"/kiln_ops_tests .gpu/pack/bin/
# KILN_BASE_KILN: an older kiln binary to compare against (bench/regress.sh), packed as bin/kiln-base.
[ -n "${KILN_BASE_KILN:-}" ] && cp "$KILN_BASE_KILN" .gpu/pack/bin/kiln-base
strip .gpu/pack/bin/* || true
for lib in libjpeg.so.62; do cp -L "/usr/lib/x86_64-linux-gnu/$lib" .gpu/pack/lib/; done
# xz -9e: the device tool's carry holds 64 MiB with the tracked tree (~41 MB), so the default
# level no longer fits. The four binaries share most of their code, but each is ~62 MB stripped:
# xz -9e's 64 MiB dictionary cannot reach back to the previous binary, and a multi-threaded xz
# compresses blocks independently. One thread and a 256 MiB dictionary (256 MiB to unpack) give
# 13.1 MB instead of 20.6 (session 31, 4e8355a; ~2 min here).
tar -C .gpu/pack -cf - bin lib | xz --lzma2=preset=9e,dict=256MiB -T1 > .gpu/payload.tar.xz
rm -rf .gpu/pack
ls -la .gpu/payload.tar.xz
