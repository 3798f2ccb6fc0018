# Sourced at the top of a GPU visit's script (bench/*_session.sh): strict pipes, the log folder
# $OUT (the device tool's, else ./out), unbuffered Python and a cubin cache of the visit's own.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache

# compute-sanitizer (memcheck, racecheck, synccheck) on `kgen run` of the .kg file $1 at ragged
# sizes ($3 M,N,K, default 2199,4008,1000), each tool's exit status and summary on one line
# labelled $2, appended to $OUT/sanitizer.log
sanitize() {
  local mnk=${3:-2199,4008,1000}
  for tool in memcheck racecheck synccheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run "$1" \
      --size "M=${mnk%%,*},N=$(echo $mnk | cut -d, -f2),K=${mnk##*,}" > /tmp/san.log 2>&1
    rc=$?
    echo "$2 $mnk $tool exit=$rc $(grep -E '^(PASS|FAIL)' /tmp/san.log | head -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
  done | tee -a "$OUT/sanitizer.log"
}
