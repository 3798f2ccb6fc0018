#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck on every example at a ragged size, on the
# GPU machine:  bash .gpu/device-run.sh bash bench/sanitize_all.sh
# Kernels whose only runtime size is M (back-to-back examples) get M alone.
set -uo pipefail
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
for ex in examples/*.kg; do
  sizes="M=1000,N=1000,K=40"
  python3 -m kgen run "$ex" --size "$sizes" >/dev/null 2>&1
  [ $? -eq 2 ] && sizes="M=1000"
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 python3 -m kgen run "$ex" --size "$sizes" \
      >/tmp/san.log 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" /tmp/san.log | tail -1)
    verdict=$(grep -E "^(PASS|FAIL)" /tmp/san.log | tail -1)
    echo "$(basename "$ex" .kg) $sizes $tool exit=$rc $verdict $summary"
  done
done
