#!/usr/bin/env bash
# Runs on the GPU machine (H200, CUDA 13, cuDNN 9.14, torch + timm present),
# after tools/gpu/pack.sh here, with .gpu carried along.
#   tools/gpu/on_device.sh OUTDIR [MODE]
# MODE:
#   all     (default) GPU tests, CPU suite, full-size checks of the ResNet trio, resnet50 bench
#   --quick GPU tests only, without the every-tactic sweeps and timing printouts
#   --bench resnet50 bench only (+ torch.compile max-autotune when KILN_AUTOTUNE_PEER=<batch>)
#   --family4  full-size checks and benches of the Res2Net and EfficientNet families (issue #4)
#   --regress  bench/regress.sh: bin/kiln-base (packed with KILN_BASE_KILN=... tools/gpu/pack.sh)
#           against bin/kiln on resnet50, res2net50_26w_4s, efficientnet_b0 at batch 1 and 32
#   --ops   the op harness only (kiln_ops_tests: every case on the CPU and CUDA backends vs the
#           plain reference; KILN_OPS_ARGS adds flags, e.g. "--perf" or "--gtest_filter=*conv2d*")
# Environment: KILN_RES2NET_MODELS / KILN_EFFNET_MODELS choose the full-size models --family4
# makes (timm names; set and empty: none of that family), KILN_CHECK_MODELS / KILN_BENCH_MODELS narrow --family4 (space-separated names;
# KILN_CHECK_MODELS=none skips the checks), KILN_PEERS=none skips the PyTorch peers,
# KILN_THRESHOLD_BATCHES runs bench/window_conv_threshold.sh on the first Res2Net model,
# KILN_PROFILE=N adds kiln's per-layer profile (N rounds) to each bench JSON,
# KILN_GPU_TEST_FILTER narrows the GPU tests (a --gtest_filter pattern), KILN_AB adds kiln-only
# benches of bundles built with engine switches set (e.g. "disable=fuse_split enable=cuda_views").
# KILN_GPU_WORK (default /tmp/kiln_gpu) is the scratch folder: give concurrent runs different ones.
# At most 8 files come back from the device tool: the run ends by packing OUTDIR into OUTDIR.tar.gz.
# Full-size check: seeded checkpoint (tools/reference/make_fixtures*.py --full-size), kiln fp32
# engine vs PyTorch fp32 (TF32 off) within 1e-3 * max|logit|, fp16 engine cosine >= 0.9995 and
# the same top-1 on sample photos (tools/gpu/compare.py). Bench: kiln bench (CUDA-graph replay)
# and tools/reference/peer_bench.py on the same weights, fp16, batch 1 and 32.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUTDIR}; mode=${2:-all}
mkdir -p "$out"
trap 'tar -C "$out" -czf "$out.tar.gz" . 2>/dev/null' EXIT
work=${KILN_GPU_WORK:-/tmp/kiln_gpu}; rm -rf $work; mkdir -p $work/full
tar -C $work -xJf .gpu/payload.tar.xz || python3 -c "import tarfile; tarfile.open('.gpu/payload.tar.xz').extractall('$work')"
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
kiln=$work/bin/kiln
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
$kiln version | tee -a "$out/gpu.txt"
status=0

# check_model NAME: fp32 and fp16 CUDA engines of $work/full/NAME against PyTorch.
check_model() {
  bash tools/check_full_size.sh $kiln cuda "$out/full_size.jsonl" "$out" $work/full/$1 || status=1
}

# bench_model NAME: kiln fp16 (opt level 3) at batch 1 and 32, then bundles built with each
# variant in KILN_AB (space-separated enable=SWITCH / disable=SWITCH, e.g. disable=fuse_split),
# then the PyTorch peers on the same weights.
bench_model() {
  local m=$1 peers=${KILN_PEERS:-eager,cuda_graph,compile_default} prof=""
  [ -n "${KILN_PROFILE:-}" ] && prof="--profile $KILN_PROFILE"
  for b in 1 32; do
    $kiln build $work/full/$m -o $work/$m.b$b.bundle --backend cuda --precision fp16 --batch $b --opt-level 3 --json \
      > "$out/build_${m}_b$b.json" 2> "$out/build_${m}_b$b.log" || status=1
    $kiln bench $work/$m.b$b.bundle --batch $b --json $prof > "$out/bench_${m}_b$b.json" || status=1
    python3 -c "import json;r=json.load(open('$out/bench_${m}_b$b.json'))['results'][0];print('kiln $m b$b', r['engine_ms'], r['kernels_per_call'], 'stable', r['stable'])"
  done
  for v in ${KILN_AB:-}; do
    for b in 1 32; do
      $kiln build $work/full/$m -o $work/$m.b$b.$v.bundle --backend cuda --precision fp16 --batch $b --opt-level 3 \
        --${v%%=*} ${v#*=} > /dev/null 2>&1 || status=1
      $kiln bench $work/$m.b$b.$v.bundle --batch $b --json > "$out/bench_${m}_b${b}_$v.json" || status=1
      python3 -c "import json;r=json.load(open('$out/bench_${m}_b${b}_$v.json'))['results'][0];print('kiln $m b$b $v', r['engine_ms']['median'], r['kernels_per_call'])"
    done
  done
  [ "$peers" = none ] && return
  for b in 1 32; do
    # PyTorch brings its own cuDNN (9.19); kiln's library path (system cuDNN 9.14) must not reach it.
    PYTHONUNBUFFERED=1 timeout ${KILN_PEER_TIMEOUT:-150} env -u LD_LIBRARY_PATH python3 tools/reference/peer_bench.py \
      --model-dir $work/full/$m --batch $b --peers $peers --rounds 100 --out "$out/peers_${m}_b$b.json" > /dev/null \
      2> "$out/peers_${m}_b$b.log" || status=1
    python3 -c "import json;r=json.load(open('$out/peers_${m}_b$b.json'));print('torch $m b$b', {k:(round(v['median_ms'],4),v.get('kernels')) for k,v in r['peers'].items()})"
  done
}

case "$mode" in
  all|--quick)
    echo "== GPU tests"
    # --quick leaves out the exhaustive every-tactic sweeps and the timing printouts (most of the
    # suite's ~6.5 minutes on the H200); the default mode runs everything.
    filter=${KILN_GPU_TEST_FILTER:-*}
    [ "$mode" = "--quick" ] && [ -z "${KILN_GPU_TEST_FILTER:-}" ] && filter='-All/ConvTactics.*:CudaKernels.LinearEveryTactic:*Perf*:CudaEngine.ThousandLoadFreeCyclesReturnEveryByte'
    # Full output (not --gtest_brief): a run cut off by the device tool's time limit still shows
    # every test that finished.
    $work/bin/kiln_gpu_tests --gtest_filter="$filter" > "$out/gpu_tests.log" 2>&1 || status=1
    grep -E "^\[  FAILED" "$out/gpu_tests.log" | head -40
    tail -5 "$out/gpu_tests.log"
    # Not in --quick: that mode alone already takes most of the device tool's 600 s.
    [ "$mode" = "--quick" ] && exit $status
    echo "== op harness"
    $work/bin/kiln_ops_tests --gtest_brief=1 --errors > "$out/ops_tests.log" 2>&1 || status=1
    grep -E "PASSED|FAILED" "$out/ops_tests.log" | tail -5
    echo "== CPU suite on this machine"
    $work/bin/kiln_tests --gtest_brief=1 > "$out/cpu_tests.log" 2>&1 || status=1
    tail -3 "$out/cpu_tests.log"
    echo "== full-size models"
    python3 tools/reference/make_fixtures.py --full-size $work/full > "$out/fixtures.log" 2>&1 || status=1
    for m in resnet50 resnet50d resnext50_32x4d; do check_model $m; done
    echo "== bench"
    bench_model resnet50
    ;;
  --regress)
    [ -x $work/bin/kiln-base ] || { echo "no bin/kiln-base in the payload (KILN_BASE_KILN=... tools/gpu/pack.sh)" >&2; exit 2; }
    bash bench/regress.sh $work/bin/kiln-base $kiln "$out/regress" ${KILN_REGRESS_MODELS:-} || status=1
    ;;
  --ops)
    $work/bin/kiln_ops_tests --gtest_brief=1 --errors ${KILN_OPS_ARGS:-} > "$out/ops_tests.log" 2>&1 || status=1
    grep -E "PASSED|FAILED" "$out/ops_tests.log" | tail -40
    ;;
  --bench)
    python3 tools/reference/make_fixtures.py --full-size $work/full > "$out/fixtures.log" 2>&1 || exit 1
    bench_model resnet50
    ;;
  --family4)
    # Set but empty: no models of that family.
    r2=${KILN_RES2NET_MODELS-res2net50_26w_4s res2net50d res2next50}
    ef=${KILN_EFFNET_MODELS-efficientnet_b0 tf_efficientnet_b0}
    [ -z "$r2" ] || python3 tools/reference/make_fixtures_res2net.py --full-size $work/full \
      --models $r2 >> "$out/fixtures.log" 2>&1 || status=1
    [ -z "$ef" ] || python3 tools/reference/make_fixtures_efficientnet.py --full-size $work/full \
      --models $ef >> "$out/fixtures.log" 2>&1 || status=1
    checks=${KILN_CHECK_MODELS:-$(find $work/full -mindepth 1 -maxdepth 1 -type d -printf "%f\n" | sort)}
    [ "$checks" = none ] || for m in $checks; do check_model "$m"; done
    # KILN_THRESHOLD_BATCHES="1 2 4 ...": kiln's window convs on/off per batch size (the
    # measurement behind kWindowConvMaxRows) on the first Res2Net model made.
    if [ -n "${KILN_THRESHOLD_BATCHES:-}" ]; then
      m=$(set -- ${KILN_RES2NET_MODELS:-res2net50_26w_4s}; echo $1)
      bash bench/window_conv_threshold.sh $kiln $work/full/$m "$out/threshold" "$KILN_THRESHOLD_BATCHES" || status=1
    fi
    bench_models=${KILN_BENCH_MODELS:-res2net50_26w_4s efficientnet_b0}
    [ "$bench_models" = none ] || for m in $bench_models; do bench_model "$m"; done
    ;;
  *) echo "unknown mode $mode" >&2; exit 1 ;;
esac
if [ -n "${KILN_AUTOTUNE_PEER:-}" ]; then
  # torch.compile max-autotune-no-cudagraphs, replayed in a CUDA graph: minutes per model and batch.
  m=${KILN_AUTOTUNE_MODEL:-resnet50}
  PYTHONUNBUFFERED=1 timeout ${KILN_AUTOTUNE_TIMEOUT:-300} env -u LD_LIBRARY_PATH python3 tools/reference/peer_bench.py \
    --model-dir $work/full/$m --batch $KILN_AUTOTUNE_PEER --peers compile --rounds 100 \
    --out "$out/peers_${m}_autotune_b$KILN_AUTOTUNE_PEER.json" > /dev/null 2> "$out/peers_autotune.log" || status=1
  python3 -c "import json;r=json.load(open('$out/peers_${m}_autotune_b$KILN_AUTOTUNE_PEER.json'));print({k:(round(v['median_ms'],4),v.get('kernels'),v.get('compile_s')) for k,v in r['peers'].items()})"
fi
exit $status
