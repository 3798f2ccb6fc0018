#!/usr/bin/env bash
# One visit: ping-pong first where the output leaves as pairs (kgen/targets/sm90/configs.py,
# PINGPONG_PAIRS_STAGES). PART=tests: the GPU tests of the builder's choices, kgen run, the EVT
# ops, reductions and the tuner; then NVRTC's time for the fast entry point alone of the five
# examples issue 15 names (this machine's CPU, fastest of 3, empty caches).
# Run: bash .gpu/device-run.sh bash bench/pairs_pingpong_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
timeout ${TESTS_S:-380} python3 -m pytest -q -m gpu -p no:cacheprovider ${SUITES:-tests/gpu/test_builder_gpu.py \
  tests/gpu/test_run_gpu.py tests/gpu/test_evt_gpu.py tests/gpu/test_reductions_gpu.py \
  tests/gpu/test_tune_gpu.py} 2>&1 | tail -12 | tee "$OUT/pytest_pairs_pingpong.log"
python3 bench/compile_times.py 2>&1 | tee "$OUT/compile_times.log"
