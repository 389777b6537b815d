# Sourced by a device call's script (bench/results/<session>/callN/call.sh, run on the GPU machine
# as `bash .gpu/callN.sh` with .gpu carried, after tools/gpu/pack.sh here): unpacks the payload into
# $work, sources full_fixture.sh ($kiln, full_fixture), makes the results folder $R (gpu.txt: the
# card) and `log STEP RC`, which appends the step's exit status and time to $R/rc.txt and tars $R
# into $OUT/res.tgz after every step, so a call cut short still returns what it did.
set -u
work=/tmp/kiln_prof; mkdir -p "$work"; rm -rf "$work/bin"; tar -C "$work" -xJf .gpu/payload.tar.xz
. tools/gpu/full_fixture.sh
[ -d /work/main/tests/fixtures ] || { mkdir -p /work; ln -sfn "$PWD" /work/main; }  # the tests' fixture path
R=$work/res; rm -rf "$R"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$R/gpu.txt"
B=$work/bin; t0=$SECONDS
log() { echo "$1 rc=$2 t=$((SECONDS-t0))" >> "$R/rc.txt"; tar -C "$work" -czf "$OUT/res.tgz" res; }
