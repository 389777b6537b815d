#!/usr/bin/env bash
# Builds kiln's libFuzzer targets (clang, ASan + UBSan, CPU-only; the `fuzz`
# preset, build-fuzz/) and runs each on its seed corpus for SECONDS, then
# prints executions and coverage per target. Fails if any target finds a
# crash, a sanitizer report, an uncaught non-kiln exception, a hang
# (-timeout) or an allocation over the limits below. Installs what is
# missing, like tools/setup.sh.
#   tools/fuzz.sh [SECONDS] [TARGET...]      default 60 s, every target
#   tools/fuzz.sh --seeds                    refresh the generated seeds in tests/fuzz/corpus/
# KILN_FUZZ_SKIP_BUILD=1 runs the fuzzers already built. Inputs that crashed are kept in build-fuzz/artifacts/; new corpus entries in
# build-fuzz/corpus/<target>/ (tests/fuzz/corpus/ is only read).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
for p in clang libclang-rt-14-dev cmake ninja-build ccache libcli11-dev nlohmann-json3-dev libgtest-dev \
         libopenblas-dev libjpeg-dev libpng-dev libssl-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if ((${#need_pkgs[@]})); then
  echo "fuzz: installing ${need_pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if [ -z "${KILN_FUZZ_SKIP_BUILD:-}" ]; then  # set: run the fuzzers already in build-fuzz/ as they are
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j"$(nproc)"
fi

if [ "${1:-}" = "--seeds" ]; then
  # Generated seeds need a real bundle of the demo model: `kiln build` of this
  # build (instrumented, CPU-only) makes one.
  cmake --build --preset fuzz -j"$(nproc)" --target kiln
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  build-fuzz/kiln build models/digits_resnet -o "$tmp/digits.bundle" --backend cpu >/dev/null
  build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus "$tmp/digits.bundle" tests/fixtures
  exit 0
fi

secs="${1:-60}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(safetensors safetensors_index bundle bundle_sections hf_config runtime_json labels_json eval_labels npy jpeg png tactics_json)
fi

mkdir -p build-fuzz/artifacts build-fuzz/logs
status=0
summary=()
total=0
for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
        -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/"$t"-)
  [ -f tests/fuzz/"$t".dict ] && args+=(-dict=tests/fuzz/"$t".dict)
  log=build-fuzz/logs/$t.log
  echo "== fuzz_$t (${secs} s)"
  rc=0
  dirs=("$work" tests/fuzz/corpus/"$t")
  # Past findings run first, under the same memory and time limits.
  [ -d tests/fuzz/regressions/"$t" ] && dirs+=(tests/fuzz/regressions/"$t")
  build-fuzz/tests/fuzz/fuzz_"$t" "${args[@]}" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  total=$((total + ${execs:-0}))
  line=$(printf '%-18s %12s execs  cov %6s  ft %6s  corpus %5s' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")
  if ((rc != 0)); then
    status=1
    line="$line  FAILED (rc $rc, log $log)"
    grep -E 'ERROR|SUMMARY|runtime error|deadly signal|uncaught|invariant|Test unit written' "$log" | head -20 >&2 || true
  fi
  summary+=("$line")
  echo "$line"
done
echo "== fuzz summary (${secs} s per target)"
printf '%s\n' "${summary[@]}"
echo "total executions: $total"
exit $status
