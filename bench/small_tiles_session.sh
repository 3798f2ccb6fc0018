#!/usr/bin/env bash
# One device visit for the 64-row ping-pong tiles (on the GPU machine, through
# .gpu/device-run.sh). PART=tests: their GPU tests (pytest -k $TESTS over $SUITES);
# PART=sanitize: compute-sanitizer on 64-row kernels at ragged sizes; PART=bench:
# bench/small_tiles.py (KGEN_SMALL= tiles, stages or rule); PART=sweep: bench/wave_split.py's
# quick sweep (the runtime sizes' choice over the sweep and own shapes). Logs land in $OUT
# (bench/logs/small_tiles/ once fetched).
. "$(dirname "$0")/session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
for part in ${PART:-tests bench}; do
  case $part in
  tests)
    timeout "${TESTS_S:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider -k "${TESTS:-pingpong64}" \
      ${SUITES:-tests/gpu/test_hopper_gpu.py tests/gpu/test_cluster_gpu.py tests/gpu/test_mn_major_gpu.py \
      tests/gpu/test_staged_input_gpu.py tests/gpu/test_staged_vectors_gpu.py} 2>&1 | tail -40 \
      | tee "$OUT/tests${TAG:+_$TAG}.log" ;;
  sanitize)
    cat > /tmp/small_check.py <<'PY'
from kgen import ir
from tests.gpu import test_hopper_gpu as h, test_staged_input_gpu as si
for mnk in ((300, 520, 136), (17, 24, 1000)):
    h._run(h._kernel("pingpong64"), mnk, "pingpong")
    h._run(si._kernel("pingpong64"), mnk, "pingpong")
h._run(h._kernel("pingpong64", dtype=ir.DType.BF16), (1000, 17, 72), "pingpong")
print("PASS")
PY
    # --report-api-errors no: cuda-bindings' driver loader probes cuGetProcAddress on the host
    for tool in memcheck racecheck synccheck; do
      PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
        --report-api-errors no python3 /tmp/small_check.py >/tmp/san.log 2>&1
      echo "$tool exit $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASS|Error' /tmp/san.log | tail -5 | tr '\n' ' ')"
    done 2>&1 | tee "$OUT/sanitizers.log" ;;
  bench)
    for t in ${DTYPES:-f16}; do
      timeout "${BENCH_S:-400}" python3 bench/small_tiles.py "$t" 2>&1 \
        | tee "$OUT/small_tiles_$t${KGEN_SMALL:+_$KGEN_SMALL}.log"
    done ;;
  sweep)
    timeout "${SWEEP_S:-400}" python3 bench/wave_split.py --part bare --quick --json "$OUT/sweep.json" \
      2>&1 | grep -v -i warn | tee "$OUT/sweep.log" ;;
  esac
done
