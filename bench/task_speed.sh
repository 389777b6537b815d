#!/usr/bin/env bash
# The classification task path against its engine (issue #11 §4), on the GPU machine:
#   bench/task_speed.sh KILN_BINARY MODEL_DIR OUTDIR [IMAGES] [THREADS]
# MODEL_DIR: a seeded full-size checkpoint (tools/reference/make_fixtures.py --full-size resnet50).
# 1. Inputs: the scikit-image sample photos of tests/fixtures/images/images (*.png) resized with
#    Pillow (LANCZOS) to 500x375 and saved as baseline 4:2:0 JPEGs, quality 90 (the size of a typical
#    ImageNet validation image); an ImageFolder of IMAGES (default 4096) copies of them in 4 classes.
# 2. Bundles: fp16 CUDA, opt level 3, one for --batch 1,64 and one for batch 1 only.
# 3. `kiln bench --batch 1 --image <one 500x375 JPEG>`: engine time (CUDA-graph replay), task p50/p95
#    from the file (decode included), the same call from the decoded pixels (decode excluded), and the
#    stage breakdown; interleaved in one process, so they share clocks.
# 4. `kiln eval --batch 64 --threads THREADS` (default: nproc) on the ImageFolder, decode included,
#    with each bundle, and `--batch 1` with the batch-1 bundle: images per second.
# Prints one line per measurement and writes OUTDIR/task_speed.jsonl (and every raw JSON).
set -uo pipefail
kiln=${1:?kiln binary}; model=${2:?model dir}; out=${3:?outdir}; n=${4:-4096}; threads=${5:-$(nproc)}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"; res="$out/task_speed.jsonl"; : > "$res"
photos="$out/photos"; ds="$out/dataset"; rm -rf "$photos" "$ds"; mkdir -p "$photos"
# PyTorch's environment has Pillow; kiln's library path must not reach it.
env -u LD_LIBRARY_PATH python3 - "$here/tests/fixtures/images/images" "$photos" <<'PY' || exit 1
import sys, pathlib
from PIL import Image
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
names = ["astronaut", "camera", "chelsea", "coffee", "rocket", "portrait"]
for name in names:
    im = Image.open(src / f"{name}.png").convert("RGB").resize((500, 375), Image.LANCZOS)
    im.save(dst / f"{name}_500x375.jpg", quality=90, subsampling=2)
print("photos:", ", ".join(f"{n}_500x375.jpg" for n in names))
PY
jpgs=("$photos"/*.jpg)
for ((i = 0; i < n; ++i)); do
  c="$ds/class$((i % 4))"; mkdir -p "$c"
  cp "${jpgs[$((i % ${#jpgs[@]}))]}" "$c/$i.jpg"
done
name=$(basename "$model")
"$kiln" build "$model" -o "$out/$name.multi.bundle" --backend cuda --precision fp16 --batch 1,64 > "$out/build_multi.log" 2>&1 || { tail -5 "$out/build_multi.log"; exit 1; }
# KILN_TASK_B1_BUNDLE=0 skips the batch-1-only bundle (and its two eval rows).
b1only=${KILN_TASK_B1_BUNDLE:-1}
if [ "$b1only" != 0 ]; then
  "$kiln" build "$model" -o "$out/$name.b1.bundle" --backend cuda --precision fp16 --batch 1 > "$out/build_b1.log" 2>&1 || { tail -5 "$out/build_b1.log"; exit 1; }
fi
row() { python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(r); open('$res','a').write(json.dumps(r)+'\n')" "$1"; }

"$kiln" bench "$out/$name.multi.bundle" --batch 1 --iterations 300 --warmup 30 --image "${jpgs[0]}" --json \
  > "$out/bench_task_b1.json" 2> "$out/bench_task_b1.log" || { tail -5 "$out/bench_task_b1.log"; exit 1; }
row "$(python3 - "$out/bench_task_b1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
e = r["engine_ms"]["median"]
t, d, b = r["task_ms"], r["task_decode_excluded_ms"], r["task_breakdown_ms"]
print(json.dumps({"what": "task_b1", "image": d["input"], "engine_ms": round(e, 4),
                  "task_p50_ms": round(t["p50"], 4), "task_p95_ms": round(t["p95"], 4),
                  "task_decode_excluded_p50_ms": round(d["p50"], 4), "task_decode_excluded_p95_ms": round(d["p95"], 4),
                  "ratio_decode_excluded_p50_to_engine": round(d["p50"] / e, 3), "goal_ratio": 1.5,
                  "breakdown_ms": {k: round(v, 4) for k, v in b.items() if k != "input"},
                  "stable": r["stable"]}))
PY
)"
for case in "multi 64" "b1 64" "b1 1"; do
  read -r bundle b <<< "$case"
  [ "$bundle" = b1 ] && [ "$b1only" = 0 ] && continue
  "$kiln" eval "$out/$name.$bundle.bundle" --dataset "$ds" --batch "$b" --threads "$threads" --json \
    > "$out/eval_$bundle.b$b.json" 2> "$out/eval_$bundle.b$b.log" || { tail -5 "$out/eval_$bundle.b$b.log"; continue; }
  row "$(python3 - "$out/eval_$bundle.b$b.json" "$bundle" "$b" "$threads" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"what": "eval", "bundle_batches": "1,64" if sys.argv[2] == "multi" else "1", "batch": int(sys.argv[3]),
                  "threads": int(sys.argv[4]), "images": r["images"], "errors": len(r.get("errors", [])),
                  "images_per_s": round(1000.0 / r["ms_per_image"], 1),
                  "images_per_s_after_first_batch": round(1000.0 / r["ms_per_image_after_first_batch"], 1),
                  "first_batch_seconds": round(r["first_batch_seconds"], 3), "goal_images_per_s": 3000}))
PY
)"
done
rm -f "$out"/*.bundle; rm -rf "$ds"
