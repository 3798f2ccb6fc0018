#!/usr/bin/env bash
# One visit: issue 16's GPU suites beside the narrow entry point's (bench/narrow_mixed_session.sh
# PART=tests ran test_any_shape_gpu.py and test_narrow_mixed_gpu.py): batches, stream-K, split-K
# with reductions, column-major outputs, the builder's choices for the sizes, and the staged C.
# Run: bash .gpu/device-run.sh bash bench/issue16_gpu_tests.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
timeout 570 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_batches_gpu.py \
  tests/gpu/test_stream_k_gpu.py tests/gpu/test_splitk_reductions_gpu.py \
  tests/gpu/test_col_output_gpu.py tests/gpu/test_builder_gpu.py tests/gpu/test_staged_input_gpu.py \
  2>&1 | tail -25 | tee "$OUT/pytest_issue16.log"
