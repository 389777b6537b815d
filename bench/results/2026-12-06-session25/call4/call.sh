#!/usr/bin/env bash
# Session 25, call 4: conv_knobs' 16-variant policy (kiln, 1af0d9c) against the 24-variant one (kiln-base, c70a36a),
# interleaved at batch 1, and the default's per-group trace.
set -u
work=/tmp/kiln_prof; mkdir -p $work
. tools/gpu/full_fixture.sh
R=$work/res; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> $R/rc.txt; tar -C $work -czf $OUT/res.tgz res; }
full_fixture r18vd $R/fixtures.log; log fixture $?
new=$work/r18vd.b1.new.bundle old=$work/r18vd.b1.old.bundle
timeout 200 $kiln build $work/full/r18vd -o $new --backend cuda --precision fp16 --batch 1 > $R/build_new.log 2>&1; log build_new $?
timeout 200 $work/bin/kiln-base build $work/full/r18vd -o $old --backend cuda --precision fp16 --batch 1 > $R/build_old.log 2>&1; log build_old $?
$kiln bench $new $old --batch 1 --iterations 300 > $R/ab_new_old.txt 2>&1; log ab $?
$kiln bench $new --batch 1 --iterations 50 --trace 20 --json > $R/trace_new.json 2>&1; log trace $?
python3 tools/gpu/compare_rtdetr.py trace --bench $R/trace_new.json > $R/groups_new.txt 2>&1; log groups $?
tar -C $work -czf $OUT/res.tgz res
