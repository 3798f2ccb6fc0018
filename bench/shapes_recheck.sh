#!/usr/bin/env bash
# Visit 3 of issue 16: test_run_gpu.py and test_hopper_gpu.py after the handmade kernel got its
# narrow entry point, and compute-sanitizer on the narrow entry points (sm_90a with and without
# the copy engine's loads, sm_80 code, reductions, ping-pong). Logs go to $OUT. Run
#   OUT=$OUT bash .gpu/device-run.sh bash bench/shapes_recheck.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
timeout 300 python3 -m pytest tests/gpu/test_run_gpu.py tests/gpu/test_hopper_gpu.py -m gpu -q -p no:cacheprovider 2>&1 | tail -6 | tee $OUT/pytest_run.log
for run in "examples/gemm_bias_relu.kg sm_90a M=1000,N=1001,K=100" "examples/gemm_bias_relu.kg sm_90a M=1000,N=1001,K=104" "examples/gemm_bias_relu.kg sm_80 M=1000,N=1001,K=100" "examples/evt_colsum.kg sm_90a M=300,N=129,K=9" "examples/evt_softmax_stats.kg sm_80 M=300,N=129,K=72" "bench/kernels/gemm_pingpong_sm90a.kg sm_90a M=1000,N=263,K=201" "bench/kernels/gemm_pingpong_sm90a.kg sm_90a M=1000,N=263,K=200"; do
  set -- $run
  for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run "$1" --arch "$2" --size "$3" --iters 1 > /tmp/san.log 2>&1
    rc=$?  # before any command substitution in the echo resets $?
    echo "$(basename "$1") $2 $3 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1) $(grep -cE '│ ok' /tmp/san.log) ok rows"
  done
done | tee $OUT/sanitizers.log
