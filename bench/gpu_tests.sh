#!/usr/bin/env bash
# The whole `pytest -m gpu`, in two visits of under 10 minutes each (HALF=1 or HALF=2). Run:
# HALF=1 bash .gpu/device-run.sh bash bench/gpu_tests.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
FIRST="tests/gpu/test_any_shape_gpu.py tests/gpu/test_batches_gpu.py tests/gpu/test_builder_gpu.py
  tests/gpu/test_run_gpu.py tests/gpu/test_tune_gpu.py tests/gpu/test_torch_library.py
  tests/gpu/test_sentinel.py tests/gpu/test_stream_k_gpu.py tests/gpu/test_splitk_reductions_gpu.py
  tests/gpu/test_reductions_gpu.py tests/gpu/test_evt_gpu.py"
if [ "${HALF:-1}" = 1 ]; then
  FILES=$FIRST
else  # every other GPU test file
  FILES=$(ls tests/gpu/test_*.py | grep -v -F -f <(echo "$FIRST" | tr ' ' '\n' | grep .))
fi
echo "== pytest -m gpu, half ${HALF:-1}: $(echo $FILES | wc -w) files"
timeout 570 python3 -m pytest -q -m gpu -p no:cacheprovider $FILES 2>&1 | tail -25 \
  | tee "$OUT/pytest_gpu_half${HALF:-1}.log"
