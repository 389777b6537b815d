#!/usr/bin/env bash
# The main job on the bundled demo model (a small timm ResNet trained on
# scikit-learn's digits by tools/reference/train_digits.py): build a bundle,
# classify sample images, and compare held-out accuracy with PyTorch's; then
# the same for the trained RT-DETR v2 demo detector (models/rtdetr_demo,
# tools/reference/train_rtdetr_demo.py): detect boxes on its samples (drawn as
# PNGs) and compare held-out COCO mAP with PyTorch's.
# Uses the GPU backend when a GPU and a CUDA build are present, else the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh release >&2
kiln=build/kiln
model=models/digits_resnet
out=build/demo
mkdir -p "$out"
backend=cpu
if "$kiln" version --json | grep -q '"cuda"' && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  backend=cuda
fi
echo "== kiln build ($backend)"
"$kiln" build "$model" -o "$out/digits.bundle" --backend "$backend"
echo "== kiln classify (5 sample images)"
"$kiln" classify "$out/digits.bundle" --image "$model"/samples/*.png --top-k 3
echo "== kiln eval on the held-out split"
"$kiln" eval "$out/digits.bundle" --dataset "$model/heldout" --json > "$out/eval.json"
python3 - "$out/eval.json" "$model/reference.json" <<'PY'
import json, sys
k = json.load(open(sys.argv[1])); r = json.load(open(sys.argv[2]))
print(f"held-out images : {k['images']}")
print(f"kiln top-1      : {100*k['top1']:.2f} %")
print(f"PyTorch top-1   : {100*r['pytorch_top1']:.2f} %  (torch {r['torch']}, timm {r['timm']}, fp32)")
print(f"difference      : {100*(k['top1']-r['pytorch_top1']):+.2f} points")
print(f"kiln latency    : {k['ms_per_image']:.3f} ms per image (pre-processing + engine, batch {k.get('batch', 16)})")
sys.exit(0 if abs(k['top1'] - r['pytorch_top1']) <= 0.005 else 1)
PY
det=models/rtdetr_demo
echo "== kiln build $det ($backend, fp32)"
"$kiln" build "$det" -o "$out/rtdetr_demo.bundle" --backend "$backend" --precision fp32
echo "== kiln detect (4 sample images, boxes drawn into $out/detections)"
"$kiln" detect "$out/rtdetr_demo.bundle" --image "$det"/samples/*.jpg --score-threshold 0.5 --draw "$out/detections"
echo "== kiln eval --coco on the held-out split"
"$kiln" eval "$out/rtdetr_demo.bundle" --coco "$det/heldout/annotations.json" --images "$det/heldout/images" --json \
  > "$out/eval_coco.json"
python3 - "$out/eval_coco.json" "$det/reference.json" <<'PY'
import json, sys
k = json.load(open(sys.argv[1])); r = json.load(open(sys.argv[2]))
print(f"held-out images : {k['images']} ({k['ground_truth']} boxes)")
print(f"kiln mAP50-95   : {k['map']:.4f}   mAP50 {k['map50']:.4f}")
print(f"PyTorch mAP50-95: {r['pytorch_map']:.4f}   mAP50 {r['pytorch_map50']:.4f}  "
      f"(torch {r['torch']}, transformers {r['transformers']}, fp32, {r['evaluator']})")
print(f"difference      : {k['map'] - r['pytorch_map']:+.4f}")
sys.exit(0 if abs(k['map'] - r['pytorch_map']) <= 0.005 else 1)
PY
