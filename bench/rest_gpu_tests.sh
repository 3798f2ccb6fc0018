#!/usr/bin/env bash
# One visit: the GPU suites this session's other visits did not run (clusters, MN-major operands,
# the Hopper kernels' ragged sizes, staged vectors, B2B and chains), on the final code. Run:
# bash .gpu/device-run.sh bash bench/rest_gpu_tests.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
timeout 570 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_cluster_gpu.py \
  tests/gpu/test_mn_major_gpu.py tests/gpu/test_hopper_gpu.py tests/gpu/test_staged_vectors_gpu.py \
  tests/gpu/test_b2b_gpu.py tests/gpu/test_chain_ring_gpu.py tests/gpu/test_chain_shapes_gpu.py \
  2>&1 | tail -15 | tee "$OUT/pytest_rest.log"
