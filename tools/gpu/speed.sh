#!/usr/bin/env bash
# Speed on a quiet GPU, one bounded device call (after tools/gpu/pack.sh here, .gpu carried):
#   tools/gpu/speed.sh OUT [SECONDS]
# One part after another, nothing else on the GPU:
# 1. Issue #11 §4: bench/task_speed.sh on the seeded full-size resnet50 (task time at batch 1 on a
#    500x375 JPEG against engine time, decode in and out; `kiln eval` images/s at batch 64).
# 2. Issue #12 §5: RT-DETR v2 r18vd (seeded, tools/reference/make_fixtures_rtdetr.py --full-size):
#    an fp16 CUDA bundle for batches 1 and 8 at opt level 3, `kiln bench` at batch 1 (with the
#    per-layer-group profile) and 8; then its PyTorch peers (tools/reference/rtdetr_peer_bench.py:
#    eager, torch.compile default and reduce-overhead, a plain CUDA-graph capture) on the same
#    checkpoint and GPU, right after.
# Checkpoints a tools/gpu/study.sh call left on the same machine (/tmp/kiln_gpu_study) are reused;
# otherwise they are made here. Every part has its own bound (SECONDS, default 560, in all).
# Returns OUT/speed.tgz (JSON, logs; no bundles or checkpoints).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}; secs=${2:-560}
work=${KILN_GPU_WORK:-/tmp/kiln_gpu_speed}; rm -rf "$work"; mkdir -p "$work" "$out"
study=/tmp/kiln_gpu_study
r=$(mktemp -d)
tar -C "$work" -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
kiln=$work/bin/kiln
pyc=(env -u LD_LIBRARY_PATH python3)  # PyTorch brings its own cuDNN
py() { "${pyc[@]}" "$@"; }
. tools/gpu/bounded.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$r/gpu.txt" 2>&1
$kiln version >> "$r/gpu.txt" 2>&1

# KILN_SPEED_PARTS chooses the parts (default "task rtdetr peers").
parts=" ${KILN_SPEED_PARTS:-task rtdetr peers} "
part() { [[ "$parts" == *" $1 "* ]]; }

# 1. the classification task path
if part task; then
res50=$study/full/resnet50
if [ ! -f "$res50/config.json" ]; then
  res50=$work/full/resnet50
  bounded 90 fixture_resnet50 "${pyc[@]}" tools/reference/make_fixtures.py --full-size "$work/full" --models resnet50
fi
bounded 200 task_speed bench/task_speed.sh "$kiln" "$res50" "$r/task_speed" 4096
fi

# 2. RT-DETR v2 r18vd: kiln, then PyTorch
m=$study/rtdetr/r18vd
if [ ! -f "$m/config.json" ]; then
  m=$work/r18vd
  bounded 120 fixture_rtdetr "${pyc[@]}" tools/reference/make_fixtures_rtdetr.py --full-size "$m"
fi
if part rtdetr && bounded 150 rtdetr_build $kiln build "$m" -o "$work/rtdetr_fp16.bundle" --backend cuda --precision fp16 \
     --batch 1,8 --opt-level 3 --json; then
  bounded 60 rtdetr_bench_b1 sh -c "$kiln bench $work/rtdetr_fp16.bundle --batch 1 --iterations 200 --warmup 20 --json --profile 20 > $r/rtdetr_bench_b1.json"
  bounded 40 rtdetr_bench_b8 sh -c "$kiln bench $work/rtdetr_fp16.bundle --batch 8 --iterations 100 --warmup 10 --json > $r/rtdetr_bench_b8.json"
  bounded 20 rtdetr_profile_check "${pyc[@]}" tools/gpu/compare_rtdetr.py profile --bench "$r/rtdetr_bench_b1.json" \
    --label "r18vd fp16 b1 profile" --jsonl "$r/rtdetr.jsonl"
fi
part peers && bounded 200 rtdetr_peers_b1 "${pyc[@]}" tools/reference/rtdetr_peer_bench.py --model-dir "$m" --batch 1 --rounds 100 \
  --warmup 20 --out "$r/rtdetr_peers_b1.json"
part peers && bounded 120 rtdetr_peers_b8 "${pyc[@]}" tools/reference/rtdetr_peer_bench.py --model-dir "$m" --batch 8 --rounds 50 \
  --warmup 10 --peers eager,compile_reduce_overhead --out "$r/rtdetr_peers_b8.json"

. tools/gpu/strip_heavy.sh; strip_heavy "$r"
cat "$r/summary.txt"
cat "$r/task_speed/task_speed.jsonl" 2>/dev/null
for b in 1 8; do
  py -c "import json;r=json.load(open('$r/rtdetr_bench_b$b.json'))['results'][0];print('kiln r18vd fp16 b$b engine_ms', r['engine_ms'], 'kernels', r['kernels_per_call'])" 2>/dev/null
  py -c "
import json
for n, p in json.load(open('$r/rtdetr_peers_b$b.json'))['peers'].items():
    print('torch r18vd fp16 b$b', n, p.get('median_ms', p.get('error')), 'kernels', p.get('kernels'))" 2>/dev/null
done
tar -C "$r" -czf "$out/speed.tgz" .
ls -la "$out/speed.tgz"
