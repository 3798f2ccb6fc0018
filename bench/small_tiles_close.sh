#!/usr/bin/env bash
# The closing visit for the 64-row ping-pong tiles (on the GPU machine, through
# .gpu/device-run.sh), one of PART=
#   check   the 64-row kernels of the Hopper suites, then bench/prototypes/ragged_probe.py
#           and the B2B example (bench/b2b_bench.py)
#   tables  the GPU tests of the runtime sizes' choice (kgen.load's sized test, builder, tune,
#           batches), then bench/wave_split.py's quick bare sweep
#   rest    the any-shape and kgen run GPU suites (kgen.load's sizes reach 64-row tiles there)
#   chain   bench/prototypes/chain_clock.py, the chain GPU suites, the issue's 24 chains
#           (bench/chain_ring.py --table) and the B2B example
#   issue15 bench/hopper_gemm.py (issue 15's table)
# Logs land in $OUT (bench/logs/small_tiles_close/ once fetched).
. "$(dirname "$0")/session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
case ${PART:-check} in
check)
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -k pingpong64 \
    tests/gpu/test_hopper_gpu.py tests/gpu/test_cluster_gpu.py tests/gpu/test_mn_major_gpu.py \
    tests/gpu/test_staged_input_gpu.py tests/gpu/test_staged_vectors_gpu.py 2>&1 | tail -5 \
    | tee "$OUT/tests_64.log"
  timeout 100 python3 bench/prototypes/ragged_probe.py 2>&1 | grep -v -i warn | tee "$OUT/ragged_probe.log"
  timeout 90 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -20 | tee "$OUT/b2b_example.log" ;;
tables)
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_any_shape_gpu.py::test_kgen_load_runs_what_the_sizes_call_for \
    tests/gpu/test_builder_gpu.py tests/gpu/test_tune_gpu.py tests/gpu/test_batches_gpu.py 2>&1 \
    | tail -8 | tee "$OUT/tests_sized.log"
  timeout 300 python3 bench/wave_split.py --part bare --quick --json "$OUT/sweep.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/sweep.log"
  ;;
rest)
  timeout 540 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_any_shape_gpu.py \
    tests/gpu/test_run_gpu.py 2>&1 | tail -8 | tee "$OUT/tests_rest.log" ;;
chain)
  timeout 60 python3 bench/prototypes/chain_clock.py 2>&1 | grep -v -i warn | tee "$OUT/chain_clock${TAG:+_$TAG}.log"
  timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_b2b_gpu.py \
    tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_chain_ring_gpu.py tests/gpu/test_builder_gpu.py \
    2>&1 | tail -6 | tee "$OUT/tests_chain${TAG:+_$TAG}.log"
  timeout 200 python3 bench/chain_ring.py --table --shapes issue --json "$OUT/chain_table${TAG:+_$TAG}.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/chain_table${TAG:+_$TAG}.log"
  timeout 60 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/b2b_example${TAG:+_$TAG}.log" ;;
issue15)
  timeout 280 python3 bench/hopper_gemm.py --json "$OUT/hopper_gemm.json" 2>&1 | grep -v -i warn \
    | tee "$OUT/hopper_gemm.log" ;;
esac
