#!/usr/bin/env bash
# A visit for sm_90a's narrow producer with strength-reduced copies (issue 16): PART=tests: the
# any-shape GPU tests (both targets' narrow entry points) and compute-sanitizer on narrow entry
# points of every granule; PART=bench: bench/before_after.py --narrow (today's narrow entry point
# against bench/baseline/narrow/, timed in alternation); PART=all: both.
# Run: bash .gpu/device-run.sh bash bench/narrow_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  echo "== pytest: any shape (narrow entry points), staged inputs, batches"
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest tests/gpu/test_any_shape_gpu.py \
    tests/gpu/test_staged_input_gpu.py tests/gpu/test_batches_gpu.py \
    -m gpu -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/pytest_narrow.log"
  for size in M=1000,N=1001,K=100 M=300,N=264,K=1002 M=77,N=131,K=1001; do
    for tool in memcheck racecheck synccheck; do
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run examples/gemm_bias_relu.kg --arch sm_90a --size $size --iters 1 >/tmp/san.log 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "gemm_bias_relu sm_90a $size $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/sanitizers_narrow.log"
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  echo "== the narrow entry point, now against before"
  timeout 400 python3 bench/before_after.py --narrow --rounds 3 --json "$OUT/narrow_before_after.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/narrow_before_after.log"
fi
