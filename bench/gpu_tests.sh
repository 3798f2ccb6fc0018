#!/usr/bin/env bash
# The whole `pytest -m gpu` in one visit: every GPU test file but the tune suite under
# pytest-xdist (14 workers: NVRTC compiles run side by side; 2313 tests in 182 s on an H200),
# then the tune suite alone (it compiles on every CPU core, and one of its tests bounds the
# wall time). Carry the wheels first: bash ../shared/gpu/prepare.sh pytest-xdist execnet.
# Without pytest-xdist on the machine, HALF=1 or HALF=2 runs half of the files serially (each
# half takes about 570 s). Run: bash .gpu/device-run.sh bash bench/gpu_tests.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
FIRST="tests/gpu/test_any_shape_gpu.py tests/gpu/test_batches_gpu.py tests/gpu/test_builder_gpu.py
  tests/gpu/test_run_gpu.py tests/gpu/test_tune_gpu.py tests/gpu/test_torch_library.py
  tests/gpu/test_sentinel.py tests/gpu/test_stream_k_gpu.py tests/gpu/test_splitk_reductions_gpu.py
  tests/gpu/test_reductions_gpu.py tests/gpu/test_evt_gpu.py"
if python3 -c "import xdist" 2>/dev/null && [ -z "${HALF:-}" ]; then
  echo "== pytest -m gpu: every file but the tune suite, 14 workers"
  # -v: each result as it lands, kept whole in the log even if the time runs out
  timeout 420 python3 -m pytest -v -m gpu -p no:cacheprovider -n 14 tests/gpu \
    --ignore=tests/gpu/test_tune_gpu.py > "$OUT/pytest_gpu_xdist.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_xdist.log" | head -20
  tail -3 "$OUT/pytest_gpu_xdist.log"
  echo "== the tune suite"
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tune_gpu.py 2>&1 \
    | tail -8 | tee "$OUT/pytest_gpu_tune.log"
  exit 0
fi
if [ "${HALF:-1}" = 1 ]; then
  FILES=$FIRST
else  # every other GPU test file
  FILES=$(ls tests/gpu/test_*.py | grep -v -F -f <(echo "$FIRST" | tr ' ' '\n' | grep .))
fi
echo "== pytest -m gpu, half ${HALF:-1}: $(echo $FILES | wc -w) files"
timeout 570 python3 -m pytest -q -m gpu -p no:cacheprovider $FILES 2>&1 | tail -25 \
  | tee "$OUT/pytest_gpu_half${HALF:-1}.log"
