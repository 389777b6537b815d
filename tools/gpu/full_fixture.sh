# Sourced by the GPU-machine scripts (profile_kernels.sh, plan_sizes.sh, fp8_one_kernel.sh):
# unpacks the payload into $work once and makes one seeded full-size model there.
#   work=/tmp/kiln_prof; . tools/gpu/full_fixture.sh      -> $kiln, $pyc, LD_LIBRARY_PATH set
#   full_fixture MODEL LOG                                  -> $work/full/MODEL (once), or returns 1
mkdir -p "$work/full"
[ -x "$work/bin/kiln" ] || tar -C "$work" -xJf .gpu/payload.tar.xz
export LD_LIBRARY_PATH=$work/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
kiln=$work/bin/kiln
pyc=(env -u LD_LIBRARY_PATH python3)  # PyTorch brings its own cuDNN

full_fixture() {  # MODEL LOG
  local m=$1 log=$2
  [ -d "$work/full/$m" ] && return 0
  case $m in
    res2ne*) "${pyc[@]}" tools/reference/make_fixtures_res2net.py --full-size "$work/full" --models "$m" ;;
    *efficientnet*) "${pyc[@]}" tools/reference/make_fixtures_efficientnet.py --full-size "$work/full" --models "$m" ;;
    r18vd) "${pyc[@]}" tools/reference/make_fixtures_rtdetr.py --full-size "$work/full/r18vd" ;;
    *) "${pyc[@]}" tools/reference/make_fixtures.py --full-size "$work/full" --models "$m" ;;
  esac > "$log" 2>&1
}
