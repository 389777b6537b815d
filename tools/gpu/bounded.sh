# Sourced by tools/gpu/study.sh and speed.sh, after they set secs (the call's bound in seconds) and
# r (the results folder): the clock starts here.
#   bounded SECONDS NAME COMMAND...  runs COMMAND for at most SECONDS, never past the call's bound,
#   output in $r/NAME.log, one line in $r/summary.txt; returns COMMAND's status (1 when skipped).
start=$(date +%s)
left() { echo $(( secs - ($(date +%s) - start) )); }
bounded() {
  local s=$1 name=$2; shift 2
  local l; l=$(left); [ "$s" -le "$l" ] || s=$l
  [ "$s" -gt 5 ] || { echo "$name: skipped (no time left)" >> "$r/summary.txt"; return 1; }
  timeout "$s" "$@" > "$r/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc$([ $rc = 124 ] && echo " (stopped at $s s)")" >> "$r/summary.txt"
  return $rc
}
