#!/usr/bin/env bash
# GPU visit for the epilogue work: GPU tests, sanitizers on the reduction examples, benchmarks.
#   bash .gpu/device-run.sh bash bench/evt_session.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -15
for ex in evt_softmax_stats evt_colsum evt_multi_output evt_select evt_residual; do
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m kgen run "examples/$ex.kg" \
    --size M=1000,N=1000,K=40 >/tmp/s.log 2>&1
  rc=$?  # before any command substitution in the echo resets $?
  echo "$ex memcheck exit $rc $(grep -E 'ERROR SUMMARY|^PASS|^FAIL' /tmp/s.log | tr '\n' ' ')"
done
compute-sanitizer --tool racecheck python3 -m kgen run examples/evt_colsum.kg \
  --size M=1000,N=1000,K=40 2>&1 | grep -E "SUMMARY|^PASS|^FAIL"
for f in bench/kernels/gemm_f16_plain.kg bench/kernels/gemm_f16_3node.kg examples/evt_softmax_stats.kg \
         examples/evt_colsum.kg examples/evt_multi_output.kg; do
  n=$(basename "$f" .kg)
  python3 -m kgen run "$f" --size M=8192,N=8192,K=8192 --bench --json >"$OUT/b_$n.json" 2>"$OUT/b_$n.err"
  rc=$?  # before any command substitution in the echo resets $?
  echo "$n bench exit $rc"
done
