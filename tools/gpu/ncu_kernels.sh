#!/usr/bin/env bash
# Hardware counters of kiln's own kernels in one engine call, on the GPU machine (after
# tools/gpu/pack.sh here, .gpu carried): builds the seeded full-size MODEL at BATCH (fp16) and
# runs `kiln bench` under Nsight Compute, profiling the first LIMIT kernels whose demangled name
# matches REGEX (default: every kiln::cuda kernel, about one call's worth). Each kernel is
# replayed alone with its counters (no PDL overlap, no neighbours), so the times are each
# kernel's own cost, not its share of the graph replay (kiln bench --trace gives that).
# Clocks are left alone (--clock-control none, device/METHOD.md).
#   tools/gpu/ncu_kernels.sh OUTDIR [MODEL] [BATCH] [REGEX] [LIMIT]
# KILN_NCU_SECTIONS adds sections, e.g. "--section SourceCounters" (the SASS lines warps stall on most).
# Writes OUTDIR/ncu_MODEL_bBATCH.txt (the details page) and a one-line-per-kernel summary
# (OUTDIR/ncu_MODEL_bBATCH_summary.txt: duration, grid, block, registers, achieved occupancy,
# SM and memory throughput).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?OUTDIR}; model=${2:-r18vd}; batch=${3:-1}; regex=${4:-kiln::cuda}; limit=${5:-80}
mkdir -p "$out"
work=/tmp/kiln_prof
. tools/gpu/full_fixture.sh
full_fixture "$model" "$out/fixtures_$model.log" || exit 1
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu not found" | tee "$out/ncu_${model}_b$batch.txt"; exit 1; }
bundle=$work/$model.b$batch.default.bundle  # profile_kernels.sh's, when it ran first
[ -f $bundle ] || bundle=$work/$model.b$batch.ncu.bundle
[ -f $bundle ] || $kiln build $work/full/$model -o $bundle --backend cuda --precision fp16 --batch $batch \
  > "$out/build_ncu.log" 2>&1 || exit 1
base=$out/ncu_${model}_b$batch
$ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" -c "$limit" \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis \
  ${KILN_NCU_SECTIONS:-} --metrics gpu__time_duration.sum -o $work/ncu_rep -f \
  $kiln bench $bundle --batch $batch --iterations 10 --warmup 0 --no-task > "$base.log" 2>&1
$ncu --import $work/ncu_rep.ncu-rep --page details > "$base.txt" 2>&1
$ncu --import $work/ncu_rep.ncu-rep --page raw --csv --print-units base \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum \
  > "$base.csv" 2>&1
python3 - "$base.csv" "${base}_summary.txt" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
with open(sys.argv[2], "w") as f:
    if hdr is None:
        f.write("no kernels profiled\n"); sys.exit(0)
    h = rows[hdr]
    col = lambda r, m: r[h.index(m)].replace(",", "") if m in h else ""  # values carry thousands separators
    f.write("   us   grid  blk regs occ%  sm%  mem%   L2 KB  kernel\n")
    for r in rows[hdr + 2:]:
        if len(r) < len(h): continue
        name = r[h.index("Kernel Name")].split("(")[0].split("<")[0].replace("void ", "").replace("unnamed>::", "")
        try:
            f.write("%6.2f %6s %4s %4s %4.0f %4.0f %5.0f %7.0f  %s\n" % (
                float(col(r, "gpu__time_duration.sum")) / 1e3, col(r, "launch__grid_size"), col(r, "launch__block_size"),
                col(r, "launch__registers_per_thread"), float(col(r, "sm__warps_active.avg.pct_of_peak_sustained_active") or 0),
                float(col(r, "sm__throughput.avg.pct_of_peak_sustained_elapsed") or 0),
                float(col(r, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed") or 0),
                float(col(r, "lts__t_bytes.sum") or 0) / 1e3, name))
        except ValueError:
            f.write("unparsed: %s\n" % r[:6])
print(open(sys.argv[2]).read()[:6000])
PY
