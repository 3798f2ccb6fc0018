#!/usr/bin/env bash
# Issue 16, split-K: compute-sanitizer on the split kernels, then bench/splitk_gelu.py (the
# issue's gelu table). Run after `pytest -m gpu`:
#   OUT=$OUT bash .gpu/device-run.sh bash bench/splitk_session.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
echo "== compute-sanitizer on split-K (sm_80 code and sm_90a plans, odd sizes)"
for run in "examples/splitk_gelu.kg sm_80 M=100,N=301,K=1001" "examples/splitk_gelu.kg sm_90a M=64,N=64,K=4096"; do
  set -- $run
  for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run "$1" --arch "$2" --size "$3" --iters 1 > /tmp/san.log 2>&1
    rc=$?  # before any command substitution in the echo resets $?
    echo "$(basename "$1") $2 $3 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1) $(grep -cE '│ ok' /tmp/san.log) ok rows"
  done
done | tee "$OUT/sanitizers_splitk.log"
echo "== bench/splitk_gelu.py"
timeout 420 python3 bench/splitk_gelu.py --json "$OUT/splitk_gelu.json" 2>&1 | grep -v Warning | tee "$OUT/splitk_gelu.log"
