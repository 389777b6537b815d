#!/usr/bin/env bash
# Runs on the GPU machine (H200, CUDA 13, cuDNN 9.14, torch + timm present):
# unpacks .gpu/payload.tar.xz, then
#   1. the GPU op harness and GPU tests (kiln_gpu_tests), and the CPU suite;
#   2. full-size seeded resnet50 / resnet50d / resnext50_32x4d: fp32 engine vs
#      PyTorch fp32 (TF32 off) within 1e-3 * max|logit|, fp16 cosine >= 0.9995
#      and the same top-1 on sample photos;
#   3. kiln bench of the fp16 bundles at batch 1 and 32.
# Usage: tools/gpu/on_device.sh OUTDIR [--quick | --bench]
#   --quick: GPU tests only; --bench: only step 3 (resnet50 fixtures made first).
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
if [ "$quick" = "--bench" ]; then
  python3 tools/reference/make_fixtures.py --full-size $work/full > "$out/fixtures.log" 2>&1 || exit 1
else
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
    $kiln build $d -o $work/$m.$p.bundle --backend cuda --precision $p --opt-level 1 > "$out/build_$m.$p.log" 2>&1 || { status=1; continue; }
    $kiln run $work/$m.$p.bundle --input pixel_values=$d/input.npy --output-dir $work/o1 >/dev/null || status=1
    python3 tools/gpu/compare.py --kind $p --label "$m $p random input" --got $work/o1/logits.npy --want $d/logits.npy | tee -a "$out/full_size.jsonl" || status=1
    $kiln run $work/$m.$p.bundle --input pixel_values=$d/images_input.npy --output-dir $work/o2 >/dev/null || status=1
    python3 tools/gpu/compare.py --kind $p --label "$m $p sample photos" --got $work/o2/logits.npy --want $d/images_logits.npy | tee -a "$out/full_size.jsonl" || status=1
  done
done
fi
echo "== bench (fp16, opt level 3) and PyTorch peers on the same weights"
peers=${KILN_PEERS:-eager,cuda_graph,compile_default}
for b in 1 32; do
  $kiln build $work/full/resnet50 -o $work/r50.b$b.bundle --backend cuda --precision fp16 --batch $b --opt-level 3 --json \
    > "$out/build_r50_b$b.json" 2> "$out/build_r50_b$b.log" || status=1
  $kiln bench $work/r50.b$b.bundle --batch $b --json > "$out/bench_resnet50_b$b.json" || status=1
  python3 -c "import json;r=json.load(open('$out/bench_resnet50_b$b.json'))['results'][0];print('kiln resnet50 b$b', r['engine_ms'], r['task_ms'], r['kernels_per_call'], 'stable', r['stable'])"
  # PyTorch brings its own cuDNN (9.19); kiln's library path (system cuDNN 9.14) must not reach it.
  PYTHONUNBUFFERED=1 env -u LD_LIBRARY_PATH python3 tools/reference/peer_bench.py --model-dir $work/full/resnet50 --batch $b --peers $peers \
    --rounds 100 --out "$out/peers_resnet50_b$b.json" > /dev/null 2> "$out/peers_b$b.log" || status=1
  python3 -c "import json;r=json.load(open('$out/peers_resnet50_b$b.json'));print({k:(round(v['median_ms'],4),v.get('kernels')) for k,v in r['peers'].items()})"
done
if [ -n "${KILN_AUTOTUNE_PEER:-}" ]; then
  # torch.compile max-autotune-no-cudagraphs, replayed in a CUDA graph: minutes per model and batch.
  PYTHONUNBUFFERED=1 timeout ${KILN_AUTOTUNE_TIMEOUT:-300} env -u LD_LIBRARY_PATH python3 tools/reference/peer_bench.py \
    --model-dir $work/full/resnet50 --batch $KILN_AUTOTUNE_PEER --peers compile --rounds 100 \
    --out "$out/peers_resnet50_autotune_b$KILN_AUTOTUNE_PEER.json" > /dev/null 2> "$out/peers_autotune.log" || status=1
  python3 -c "import json;r=json.load(open('$out/peers_resnet50_autotune_b$KILN_AUTOTUNE_PEER.json'));print({k:(round(v['median_ms'],4),v.get('kernels'),v.get('compile_s')) for k,v in r['peers'].items()})"
fi
tar -C $out -czf $out/../logs.tar.gz . 2>/dev/null
exit $status
