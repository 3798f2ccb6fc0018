#!/usr/bin/env bash
# The cluster feature on the GPU machine:  bash .gpu/device-run.sh bash bench/cluster_session.sh [what]
# what: smoke, tests, sanitize, bench (default: smoke tests sanitize). Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
LOGS=${OUT:-/tmp/out}/cluster; mkdir -p "$LOGS"
steps=${*:-smoke tests sanitize}
kg() {  # a bf16 GEMM with `cluster $1` and `$2` (a schedule line or nothing)
  cat > "/tmp/cluster_$1$3.kg" <<KG
kernel cluster_gemm {
  target sm_90a
  $2
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  tensor D : bf16[M, N] row out
  gemm g = A @ B {
    cluster $1
    epilogue { D = acc }
  }
}
KG
  echo "/tmp/cluster_$1$3.kg"
}
for step in $steps; do
  case $step in
  smoke)
    for c in 2x1 1x2; do
      for sched in "" "schedule pingpong"; do
        f=$(kg $c "$sched" "${sched:+_pp}")
        timeout 90 python3 -m kgen run "$f" --size M=1100,N=1160,K=200 2>&1 | tail -4 | sed "s|^|smoke $c ${sched:-cooperative}: |"
        echo "smoke $c ${sched:-cooperative} exit ${PIPESTATUS[0]}"
      done
    done 2>&1 | tee "$LOGS/smoke.log" ;;
  tests)
    timeout ${TEST_TIMEOUT:-170} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_cluster_gpu.py \
      ${PYTEST_ARGS:-} 2>&1 | tail -40 | tee "$LOGS/pytest.log" ;;
  sanitize)
    for c in 2x1 1x2; do
      f=$(kg $c "" "")
      for tool in memcheck racecheck synccheck; do
        timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run "$f" \
          --size M=300,N=520,K=136 > /tmp/san.log 2>&1
        rc=$?
        echo "cluster $c $tool exit=$rc $(grep -E '^(PASS|FAIL)' /tmp/san.log | tail -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
        if [ $rc -ne 0 ]; then tail -30 /tmp/san.log; fi
      done
    done 2>&1 | tee "$LOGS/sanitize.log" ;;
  bench)
    timeout ${BENCH_TIMEOUT:-280} python3 bench/cluster_gemm.py --json "$LOGS/cluster_gemm.json" 2>&1 | tee "$LOGS/cluster_gemm.log" ;;
  esac
done
