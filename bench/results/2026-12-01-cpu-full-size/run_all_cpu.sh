#!/usr/bin/env bash
# Full-size seeded checks of every named Res2Net/EfficientNet variant on the CPU backend
# (README.md here). Needs torch + timm and build/kiln; writes ${OUT:-/tmp/fs_all.jsonl}.
cd "$(dirname "$0")/../../.."  # the repository root
R2="res2net50_26w_6s res2net50_26w_8s res2net50_48w_2s res2net50_14w_8s res2net101_26w_4s res2net50d res2net101d res2next50"
EF="efficientnet_b0 efficientnet_b1 efficientnet_b2 efficientnet_b3 efficientnet_b4 tf_efficientnet_b0 tf_efficientnet_b1 tf_efficientnet_b2 tf_efficientnet_b3 tf_efficientnet_b4 efficientnet_lite0 efficientnet_lite1 efficientnet_lite2 efficientnet_lite3 efficientnet_lite4 tf_efficientnet_lite0 tf_efficientnet_lite1 tf_efficientnet_lite2 tf_efficientnet_lite3 tf_efficientnet_lite4 efficientnetv2_rw_s tf_efficientnetv2_s"
for m in $R2; do
  python3 tools/reference/make_fixtures_res2net.py --full-size /tmp/fs/$m --models $m >> /tmp/fs_gen.log 2>&1
  bash tools/check_full_size.sh build/kiln cpu ${OUT:-/tmp/fs_all.jsonl} /tmp/fs_logs /tmp/fs/$m/$m > /dev/null
  rm -f /tmp/fs/$m/$m/model.safetensors
done
for m in $EF; do
  python3 tools/reference/make_fixtures_efficientnet.py --full-size /tmp/fs/$m --models $m >> /tmp/fs_gen.log 2>&1
  bash tools/check_full_size.sh build/kiln cpu ${OUT:-/tmp/fs_all.jsonl} /tmp/fs_logs /tmp/fs/$m/$m > /dev/null
  rm -f /tmp/fs/$m/$m/model.safetensors
done
echo done >> /tmp/fs_gen.log
