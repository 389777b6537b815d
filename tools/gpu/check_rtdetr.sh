#!/usr/bin/env bash
# RT-DETR v2 (r18vd structure, seeded) on the CUDA backend against PyTorch, on the GPU machine
# (H200, CUDA 13, torch + transformers present), after tools/gpu/pack.sh here with .gpu carried:
#   tools/gpu/check_rtdetr.sh OUTDIR
# 1. tools/reference/make_fixtures_rtdetr.py --full-size: the r18vd model at 640x640 with its
#    random input and PyTorch fp32 outputs; tools/reference/rtdetr_reference.py: PyTorch fp32 on
#    6 sample photos (RTDetrImageProcessor) and the stress inputs (zeros, ones, noise at 10x range).
# 2. kiln CUDA bundles: fp32 (batch 1, opt level 1) and fp16 (batches 1 and 8, opt level 3).
# 3. Checks (tools/gpu/compare_rtdetr.py), one summary line each, JSON lines in OUTDIR/rtdetr.jsonl:
#    fp32 logits and boxes within 1e-3 * max|ref| per query (queries whose encoder scores tie
#    within fp32 rounding may swap places: counted, and strict_pass says whether the comparison by
#    index alone holds) on the random input and the photos; fp16 by the issue's detection rule at
#    threshold 0.3 (random input, photos; see `allow` below); no NaN/Inf on the stress inputs
#    (fp32 and fp16).
# 4. kiln bench --json at batch 1 (with --profile: per-layer-group table) and batch 8, fp16.
# About 3-4 minutes on an H200 (most of it the model build on the CPU and the fp16 tactic timing).
# Environment: KILN_GPU_WORK (default /tmp/kiln_gpu_rtdetr) scratch folder; KILN_SKIP_BENCH=1 stops
# after the checks (step 4 is for a quiet GPU: tools/gpu/speed.sh); KILN_PROFILE rounds
# of the per-layer profile (default 20); KILN_BENCH_ARGS extra `kiln bench` flags; KILN_BUILD_FLAGS
# extra `kiln build` flags for the fp16 bundle (e.g. "--enable small_gemm"). For a dry run
# elsewhere: KILN_BIN (a kiln binary instead of the payload's), KILN_BACKEND (default cuda),
# PYTHON (default python3; needs numpy, torch, transformers, PIL), e.g.
#   KILN_BIN=build/kiln KILN_BACKEND=cpu PYTHON=/work/venv-ref/bin/python \
#     KILN_PROFILE=1 KILN_BENCH_ARGS="--iterations 10 --warmup 1 --no-task" tools/gpu/check_rtdetr.sh /tmp/out
# Exit status 1 when any check fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUTDIR}
mkdir -p "$out"
trap 'tar -C "$out" -czf "$out.tar.gz" . 2>/dev/null' EXIT
work=${KILN_GPU_WORK:-/tmp/kiln_gpu_rtdetr}; rm -rf "$work"; mkdir -p "$work"
if [ -n "${KILN_BIN:-}" ]; then
  kiln=$(realpath "$KILN_BIN")
else
  tar -C "$work" -xJf .gpu/payload.tar.xz || python3 -c "import tarfile; tarfile.open('.gpu/payload.tar.xz').extractall('$work')"
  export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
  kiln=$work/bin/kiln
fi
backend=${KILN_BACKEND:-cuda}
jsonl=$out/rtdetr.jsonl
m=$work/r18vd
status=0
# PyTorch brings its own cuDNN; kiln's library path must not reach it.
py() { env -u LD_LIBRARY_PATH "${PYTHON:-python3}" "$@"; }
check() { py tools/gpu/compare_rtdetr.py "$@" --jsonl "$jsonl" || status=1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"

echo "== reference (PyTorch fp32, CPU)"
py tools/reference/make_fixtures_rtdetr.py --full-size "$m" > "$out/fixtures.log" 2>&1 || { tail -5 "$out/fixtures.log"; exit 1; }
imgs=$(ls tests/fixtures/images/images/*.png | head -6)
py tools/reference/rtdetr_reference.py --model-dir "$m" --images $imgs --out-dir "$m" 2> "$out/reference.log" ||
  { tail -5 "$out/reference.log"; exit 1; }

echo "== build"
build() {  # build NAME ARGS...
  local name=$1; shift
  if ! $kiln build "$m" -o "$work/$name.bundle" --backend "$backend" --json "$@" > "$out/build_$name.json" 2> "$out/build_$name.log"; then
    status=1; echo "{\"label\": \"build $name\", \"pass\": false}" | tee -a "$jsonl"; tail -5 "$out/build_$name.log"; return 1
  fi
  echo "built $name"
}
build fp32 --precision fp32 --batch 1 --opt-level 1
build fp16 --precision fp16 --batch 1,8 --opt-level 3 ${KILN_BUILD_FLAGS:-}

echo "== checks"
run() {  # run BUNDLE INPUT OUTDIR
  rm -rf "$3"
  $kiln run "$work/$1.bundle" --input "pixel_values=$2" --output-dir "$3" > /dev/null 2>> "$out/run.log"
}
# fp16: the seeded model's encoder top-k gaps (min 7.9e-6 on the random input) are far below fp16
# rounding, so a few of the 300 queries are swapped for others (the fp16 CPU engine: 3-6 of 300
# detections per image unmatched); up to 10 per image are allowed and the JSON line gives the
# count and strict_pass (none unmatched, the issue's rule as written, meant for a trained model).
declare -A allow=([fp32]="" [fp16]="--allowed-unmatched 10")
for p in fp32 fp16; do
  [ -f "$work/$p.bundle" ] || continue
  for set in "random:input.npy:" "photos:images_input.npy:images_"; do
    IFS=: read -r label input prefix <<< "$set"
    if run $p "$m/$input" "$work/o"; then check $p --got "$work/o" --want "$m/$prefix" --label "r18vd $p $label" ${allow[$p]}
    else status=1; echo "{\"label\": \"r18vd $p $label\", \"pass\": false, \"error\": \"kiln run failed\"}" | tee -a "$jsonl"; fi
  done
  for s in zeros ones noise; do
    if run $p "$m/stress_$s.npy" "$work/o"; then check finite --got "$work/o" --label "r18vd $p stress $s"
    else status=1; echo "{\"label\": \"r18vd $p stress $s\", \"pass\": false, \"error\": \"kiln run failed\"}" | tee -a "$jsonl"; fi
  done
done

echo "== bench (fp16, $backend; on CUDA engine time is CUDA-graph replay)"
if [ -f "$work/fp16.bundle" ] && [ -z "${KILN_SKIP_BENCH:-}" ]; then
  $kiln bench "$work/fp16.bundle" --batch 1 --json --profile "${KILN_PROFILE:-20}" ${KILN_BENCH_ARGS:-} > "$out/bench_b1.json" 2> "$out/bench_b1.log" || status=1
  $kiln bench "$work/fp16.bundle" --batch 8 --json ${KILN_BENCH_ARGS:-} > "$out/bench_b8.json" 2> "$out/bench_b8.log" || status=1
  for b in 1 8; do
    py -c "import json;r=json.load(open('$out/bench_b$b.json'))['results'][0];print('kiln r18vd fp16 b$b $backend engine_ms', r['engine_ms'], 'kernels', r['kernels_per_call'])" || status=1
  done
  check profile --bench "$out/bench_b1.json" --label "r18vd fp16 b1 profile"
fi
exit $status
