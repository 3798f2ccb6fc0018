#!/usr/bin/env bash
# The whole `pytest -m gpu`, in three visits of the device's 10 minutes (session 16, H200:
# 4993 tests but the tune suite, about 40-70 s for the attention backward's files and 320 s for
# the rest with 15 workers, NVRTC compiles side by side). PART=1: the attention backward's and
# gradients' files; PART=2: every other file but the tune suite; PART=3: the tune suite alone
# (it compiles on every CPU core, and one of its tests bounds the wall time). Carry the wheels
# first: bash ../shared/gpu/prepare.sh pytest-xdist execnet. Without pytest-xdist on the
# machine, HALF=1 or HALF=2 runs half of the files serially (too long for one visit now: run
# them with -k). Run: PART=1 bash .gpu/device-run.sh bash bench/gpu_tests.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
FIRST="tests/gpu/test_any_shape_gpu.py tests/gpu/test_batches_gpu.py tests/gpu/test_builder_gpu.py
  tests/gpu/test_run_gpu.py tests/gpu/test_tune_gpu.py tests/gpu/test_torch_library.py
  tests/gpu/test_sentinel.py tests/gpu/test_stream_k_gpu.py tests/gpu/test_splitk_reductions_gpu.py
  tests/gpu/test_reductions_gpu.py tests/gpu/test_evt_gpu.py"
BACKWARD=$(ls tests/gpu/test_attention_bwd*_gpu.py tests/gpu/test_attention_grad*_gpu.py \
  tests/gpu/test_attention_varlen_bwd_gpu.py tests/gpu/test_sequence*_gpu.py)
if python3 -c "import xdist" 2>/dev/null && [ -z "${HALF:-}" ]; then
  case "${PART:-1}" in
    1) FILES=$BACKWARD ;;
    2) FILES=$(ls tests/gpu/test_*.py | grep -v -F -f <(echo "$BACKWARD"; echo test_tune_gpu.py)) ;;
    3) echo "== the tune suite"
       timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tune_gpu.py 2>&1 \
         | tail -8 | tee "$OUT/pytest_gpu_tune.log"
       exit 0 ;;
  esac
  echo "== pytest -m gpu, part ${PART:-1}: $(echo $FILES | wc -w) files, 15 workers"
  # -v: each result as it lands, kept whole in the log even if the time runs out
  timeout 540 python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 15 $FILES \
    > "$OUT/pytest_gpu_part${PART:-1}.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_part${PART:-1}.log" | head -20
  tail -3 "$OUT/pytest_gpu_part${PART:-1}.log"
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
