#!/usr/bin/env bash
# MN-major operands on the GPU machine: the GPU tests, compute-sanitizer (memcheck, racecheck,
# synccheck) on two MN-major kernels at ragged sizes (fast and narrow entry points), and
# bench/mn_major.py. Logs go to $OUT.
#   bash .gpu/device-run.sh bash bench/mn_major_session.sh [tests|sanitize|bench ...]
set -uo pipefail
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
steps=${*:-tests sanitize bench}
for step in $steps; do
  case $step in
    tests)
      timeout 200 python3 -m pytest tests/gpu/test_mn_major_gpu.py -q -p no:cacheprovider -m gpu \
        -x 2>&1 | tee "$OUT/pytest_mn_major.log" | tail -25 ;;
    sanitize)
      # (kernel, sizes): both operands MN-major through the copy engine; B MN-major through
      # the narrow entry point (odd N and K)
      for case in "bench/kernels/gemm_a_col_b_row_sm90a.kg M=1000,N=1000,K=200" \
                  "examples/gemm_b_row.kg --arch sm_90a M=17,N=999,K=33"; do
        ex=${case% *}; sizes=${case##* }
        for tool in memcheck racecheck synccheck; do
          timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 -m kgen run \
            $ex --size "$sizes" >/tmp/san.log 2>&1
          rc=$?
          summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" /tmp/san.log | tail -1)
          verdict=$(grep -E "^(PASS|FAIL)" /tmp/san.log | tail -1)
          echo "$ex $sizes $tool exit=$rc $verdict $summary" | tee -a "$OUT/sanitize_mn_major.log"
        done
      done ;;
    bench)
      timeout 280 python3 bench/mn_major.py --json "$OUT/mn_major.json" 2>&1 \
        | tee "$OUT/mn_major_bench.log" ;;
  esac
done
