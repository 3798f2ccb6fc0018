#!/usr/bin/env bash
# One visit for the runtime sizes' choice (kgen/lower/builder.py's `sized`): its GPU tests, the
# builder's and the tuner's, then bench/wave_split.py (bare GEMM and the gelu table).
# PART=tests | bench. Run: bash .gpu/device-run.sh bash bench/sized_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
case ${PART:-tests} in
tests)
  echo "== pytest: kgen.load follows the sizes; the builder's and the tuner's GPU tests"
  timeout 400 python3 -m pytest tests/gpu/test_any_shape_gpu.py tests/gpu/test_builder_gpu.py \
    tests/gpu/test_tune_gpu.py tests/gpu/test_run_gpu.py -m gpu -q -p no:cacheprovider \
    -k "sizes_call_for or builder or tune or run" 2>&1 | tail -25 | tee "$OUT/pytest_sized.log" ;;
bench)
  echo "== bench/wave_split.py"
  timeout 560 python3 bench/wave_split.py --json "$OUT/wave_split.json" 2>&1 | grep -v Warning \
    | tee "$OUT/wave_split.log" ;;
esac
# PART=final: the sized choice's GPU test after the wave model's refinement, bench/wave_split.py
# and bench/batched.py (with the `sized` rows)
if [ "${PART:-}" = final ]; then
  timeout 120 python3 -m pytest tests/gpu/test_any_shape_gpu.py -m gpu -q -p no:cacheprovider \
    -k "sizes_call_for" 2>&1 | tail -5 | tee "$OUT/pytest_sized_final.log"
  timeout 330 python3 bench/wave_split.py --json "$OUT/wave_split_final.json" 2>&1 | grep -v Warning \
    | tee "$OUT/wave_split_final.log"
  timeout 120 python3 bench/batched.py --json "$OUT/batched_sized.json" 2>&1 | grep -v Warning \
    | tee "$OUT/batched_sized.log"
fi
