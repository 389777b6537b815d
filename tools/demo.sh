#!/usr/bin/env bash
# The main job on the bundled demo model (a small timm ResNet trained on
# scikit-learn's digits by tools/reference/train_digits.py): build a bundle,
# classify sample images, and compare held-out accuracy with PyTorch's.
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
