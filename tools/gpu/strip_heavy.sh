# Sourced by tools/gpu/verify.sh, study.sh and speed.sh: strip_heavy DIR deletes what must not come
# back from the device (bundles, checkpoints, arrays, nested archives, generated model and data
# folders), so the archive of DIR stays far below the 16 MiB a returned file may have (session 9
# lost a call's results to a 165 MB archive). One list, so the two calls cannot drift apart.
strip_heavy() {
  find "$1" \( -name bundles -o -name '*.bundle' -o -name '*.safetensors' -o -name '*.npy' -o -name '*.tar.gz' \
    -o -name full -o -name dataset \) -prune -exec rm -rf {} + 2>/dev/null
}
