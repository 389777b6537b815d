#!/usr/bin/env bash
# Runs on the GPU machine (H200, CUDA 13, cuDNN 9.14, torch + timm present):
# unpacks .gpu/payload.tar.xz, then
#   1. the GPU op harness and GPU tests (kiln_gpu_tests), and the CPU suite;
#   2. full-size seeded resnet50 / resnet50d / resnext50_32x4d: fp32 engine vs
#      PyTorch fp32 (TF32 off) within 1e-3 * max|logit|, fp16 cosine >= 0.9995
#      and the same top-1 on sample photos;
#   3. kiln bench of the fp16 bundles at batch 1 and 32.
# Usage: tools/gpu/on_device.sh OUTDIR [--quick]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUTDIR}; quick=${2:-}
mkdir -p "$out"
work=/tmp/kiln_gpu; rm -rf $work; mkdir -p $work
tar -C $work -xJf .gpu/payload.tar.xz || python3 -c "import tarfile,sys; tarfile.open('.gpu/payload.tar.xz').extractall('$work')"
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
kiln=$work/bin/kiln
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
$kiln version | tee -a "$out/gpu.txt"
status=0
echo "== GPU tests"
$work/bin/kiln_gpu_tests --gtest_brief=1 > "$out/gpu_tests.log" 2>&1 || status=1
tail -5 "$out/gpu_tests.log"
[ "$quick" = "--quick" ] && exit $status
echo "== CPU suite on this machine"
(cd build 2>/dev/null; true); $work/bin/kiln_tests --gtest_brief=1 > "$out/cpu_tests.log" 2>&1 || status=1
tail -3 "$out/cpu_tests.log"
echo "== full-size models"
python3 tools/reference/make_fixtures.py --full-size $work/full > "$out/fixtures.log" 2>&1 || status=1
imgs=$(ls tests/fixtures/images/images/*.png | head -6)
: > "$out/full_size.jsonl"
for m in resnet50 resnet50d resnext50_32x4d; do
  d=$work/full/$m
  python3 tools/reference/reference_logits.py --model-dir $d --images $imgs --out-dir $d 2>>"$out/fixtures.log"
  for p in fp32 fp16; do
    $kiln build $d -o $work/$m.$p.bundle --backend cuda --precision $p > "$out/build_$m.$p.log" 2>&1 || { status=1; continue; }
    $kiln run $work/$m.$p.bundle --input pixel_values=$d/input.npy --output-dir $work/o1 >/dev/null || status=1
    python3 tools/gpu/compare.py --kind $p --label "$m $p random input" --got $work/o1/logits.npy --want $d/logits.npy | tee -a "$out/full_size.jsonl" || status=1
    $kiln run $work/$m.$p.bundle --input pixel_values=$d/images_input.npy --output-dir $work/o2 >/dev/null || status=1
    python3 tools/gpu/compare.py --kind $p --label "$m $p sample photos" --got $work/o2/logits.npy --want $d/images_logits.npy | tee -a "$out/full_size.jsonl" || status=1
  done
done
echo "== bench (fp16)"
for b in 1 32; do
  $kiln build $work/full/resnet50 -o $work/r50.b$b.bundle --backend cuda --precision fp16 --batch $b >/dev/null 2>&1
  $kiln bench $work/r50.b$b.bundle --batch $b --json > "$out/bench_resnet50_b$b.json" || status=1
  python3 -c "import json;r=json.load(open('$out/bench_resnet50_b$b.json'))['results'][0];print('resnet50 b$b', r['engine_ms'], r['kernels_per_call'])"
done
exit $status
