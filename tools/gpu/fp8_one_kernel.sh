#!/usr/bin/env bash
# The fp8_one_kernel experiment (docs/quantization.md "Where the targets stand"), on the GPU machine
# after tools/gpu/pack.sh here (.gpu carried): for each MODEL (seeded full size), builds at batch 1,
# opt level 3, fp16, FP8 (default recipe) and FP8 with `--enable fp8_one_kernel` (8-bit layers on a
# one-kernel path wherever one exists), then times the three with `kiln bench` in ROUNDS alternating
# rounds (engine time, CUDA-graph replay) and writes OUT/one_kernel.txt: per round the medians and
# kernels per call, then the median of the rounds and the ratio to fp16.
#   tools/gpu/fp8_one_kernel.sh OUT [ROUNDS] [MODEL...]   (default: 3 resnet50 efficientnet_b0)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUT}; rounds=${2:-3}; shift $(( $# >= 2 ? 2 : 1 ))
models=("$@"); [ ${#models[@]} -eq 0 ] && models=(resnet50 efficientnet_b0)
work=/tmp/kiln_prof; mkdir -p "$out"
. tools/gpu/full_fixture.sh
calib=tests/fixtures/images/images
for m in "${models[@]}"; do
  full_fixture "$m" "$out/fixtures_$m.log" || { echo "$m: fixture failed" | tee -a "$out/one_kernel.txt"; continue; }
  common=(--backend cuda --precision fp16 --batch 1 --opt-level 3)
  $kiln build $work/full/$m -o $work/$m.ok_fp16.bundle "${common[@]}" > "$out/build_${m}_fp16.log" 2>&1 &&
  $kiln build $work/full/$m -o $work/$m.ok_fp8.bundle "${common[@]}" --quantize fp8 --calib $calib > "$out/build_${m}_fp8.log" 2>&1 &&
  $kiln build $work/full/$m -o $work/$m.ok_fp8_one.bundle "${common[@]}" --quantize fp8 --calib $calib --enable fp8_one_kernel \
    > "$out/build_${m}_fp8_one.log" 2>&1 || { echo "$m: build failed" | tee -a "$out/one_kernel.txt"; continue; }
  for v in fp8 fp8_one; do $kiln inspect --plan $work/$m.ok_$v.bundle > "$out/plan_${m}_$v.txt" 2>&1; done
  for r in $(seq 1 "$rounds"); do
    for v in fp16 fp8 fp8_one; do
      $kiln bench $work/$m.ok_$v.bundle --batch 1 --iterations 300 --warmup 30 --json > "$out/bench_${m}_${v}_$r.json" 2>/dev/null
    done
  done
  python3 - "$out" "$m" "$rounds" >> "$out/one_kernel.txt" <<'PY'
import json, statistics, sys
out, m, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
med = {}
for v in ("fp16", "fp8", "fp8_one"):
    xs, k = [], None
    for r in range(1, rounds + 1):
        try:
            res = json.load(open(f"{out}/bench_{m}_{v}_{r}.json"))["results"][0]
        except Exception as e:
            print(f"{m} {v} round {r}: no result ({e})"); continue
        xs.append(res["engine_ms"]["median"]); k = res.get("kernels_per_call")
    if xs:
        med[v] = statistics.median(xs)
        print(f"{m} {v}: rounds {' '.join(f'{x:.4f}' for x in xs)} ms, median {med[v]:.4f} ms, {k} kernels/call"
              + (f", {med['fp16'] / med[v]:.3f}x fp16" if "fp16" in med and v != "fp16" else ""))
PY
done
cat "$out/one_kernel.txt"
