# Sourced at the top of a GPU visit's script (bench/gpu_tests.sh): strict pipes, the log folder
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

# compute-sanitizer (memcheck, racecheck, synccheck) at M = 17 and 1000 on B2B_CHAIN whose last
# epilogue reads bias1[col], for each dtype/K0/N0/N1 argument; one line each to $OUT/$1
sanitize_biased_chains() {
  local log=$1; shift
  for chain in "$@"; do
    python3 - "$chain" <<'PY'
import sys
from tests.kernels import biased_chain_text
t, k0, n0, n1 = sys.argv[1].split("/")
open("/tmp/biased.kg", "w").write(biased_chain_text(t, k0, n0, n1))
PY
    for m in 17 1000; do
      for tool in memcheck racecheck synccheck; do
        timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run \
          /tmp/biased.kg --size M=$m > /tmp/san.log 2>&1
        echo "$chain M=$m $tool exit=$? $(grep -E '^(PASS|FAIL)' /tmp/san.log | head -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
      done
    done
  done | tee "$OUT/$log"
}
