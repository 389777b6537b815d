#!/usr/bin/env bash
# Load time of a bundle and `kiln eval` time per image at several batch sizes
# (issue #10 §5), on the GPU machine after tools/gpu/pack.sh (or anywhere with
# --backend cpu rows only):
#   bench/load_and_eval.sh KILN_BINARY MODEL_DIR OUTDIR [IMAGES]
# MODEL_DIR: a seeded checkpoint (tools/reference/make_fixtures.py --full-size).
# Two fp16 CUDA bundles are built: one for batch 1 only (as before per-batch
# plans) and one for --batch 1,16,64. The dataset is an ImageFolder of IMAGES
# copies of the sample photos (JPEG) in tests/fixtures/images/images (default
# 256): eval time includes decode and pre-processing, on one thread.
# Prints one line per measurement and writes OUTDIR/load_and_eval.jsonl.
set -uo pipefail
kiln=${1:?kiln binary}; model=${2:?model dir}; out=${3:?outdir}; n=${4:-1024}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"; res="$out/load_and_eval.jsonl"; : > "$res"
ds="$out/dataset"; rm -rf "$ds"
photos=("$here"/tests/fixtures/images/images/*.jpg)
for ((i = 0; i < n; ++i)); do
  c="$ds/class$((i % 4))"; mkdir -p "$c"
  cp "${photos[$((i % ${#photos[@]}))]}" "$c/$i.jpg"
done
name=$(basename "$model")
"$kiln" build "$model" -o "$out/$name.b1.bundle" --backend cuda --precision fp16 --batch 1 > "$out/build_b1.log" 2>&1 || exit 1
"$kiln" build "$model" -o "$out/$name.multi.bundle" --backend cuda --precision fp16 --batch 1,16,64 > "$out/build_multi.log" 2>&1 || exit 1
for bundle in b1 multi; do
  # load_ms: Engine::load + create_context; first_call_ms: the first call at that batch
  # (planning it, cuDNN plan builds, CUDA-graph capture); engine_ms: steady state.
  for backend in cuda cpu; do
    for b in 1 16 64; do
      [ $backend = cpu ] && [ $b != 1 ] && continue
      "$kiln" bench "$out/$name.$bundle.bundle" --backend $backend --batch $b --iterations 10 --warmup 0 --no-task --json \
        > "$out/bench_$bundle.$backend.b$b.json" 2> /dev/null || continue
      python3 - "$out/bench_$bundle.$backend.b$b.json" "$bundle" "$backend" "$res" $b <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
row = {"what": "load", "bundle": sys.argv[2], "backend": sys.argv[3], "batch": int(sys.argv[5]), "load_ms": round(r["load_ms"], 1),
       "first_call_ms": round(r["first_call_ms"], 1), "engine_ms": round(r["engine_ms"]["median"], 4)}
print(row); open(sys.argv[4], "a").write(json.dumps(row) + "\n")
PY
    done
  done
  for b in 1 16 64; do
    "$kiln" eval "$out/$name.$bundle.bundle" --dataset "$ds" --batch $b --json > "$out/eval_$bundle.b$b.json" 2> "$out/eval_$bundle.b$b.log" || exit 1
    python3 - "$out/eval_$bundle.b$b.json" "$bundle" "$b" "$res" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
row = {"what": "eval", "bundle": sys.argv[2], "batch": int(sys.argv[3]), "images": r["images"], "ms_per_image": r["ms_per_image"],
       "first_batch_seconds": round(r["first_batch_seconds"], 3), "ms_per_image_after_first_batch": r["ms_per_image_after_first_batch"]}
print(row); open(sys.argv[4], "a").write(json.dumps(row) + "\n")
PY
  done
done
