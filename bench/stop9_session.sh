#!/usr/bin/env bash
# The ninth stop's GPU visits for issue 17, on the GPU machine through .gpu/device-run.sh
# (carry .whl and .gpu). Logs land in $OUT (bench/logs/stop9/ once fetched). STEP=
#   a  the whole `pytest -m gpu` (bench/gpu_tests.sh), then compute-sanitizer on chains whose
#      last N overhangs the tile (N1 = 96, 160, 224, with a bias1[col] epilogue) at M = 17, 1000
#   b  N1 over 256 and not a multiple of 128 (320, 448) on whole passes of 128 against the sm_80
#      tiled chain they ran before (consumers_probe.py --tiles), their GPU tests, the sanitizers
#      on two of them, then chains of my own never tuned for (bench/defaults.py --part 2
#      --chains), the kinds off the ping-pong chain among them
#   c  after g1's resident B in 64-byte swizzled k tiles (N0 = 96, 32, 160 on wgmma): the chain
#      GPU suites, b2b_gemm_rf(_bf16) on sm_90a (its g1 moved to wgmma) and the sanitizers on it
#      and on two such chains, then the chains of my own again
#   d  column blocks (N1 over 512; N0 = 128 with N1 of 448, 512): the chain GPU suites with the
#      batched ones, the sanitizers on two such chains, their times against the kernels they
#      ran before (column_blocks_probe.py), and x the PyTorch chain (f16)
. "$(dirname "$0")/session_head.sh"

case ${STEP:-a} in
a)
  bash bench/gpu_tests.sh
  sanitize_biased_chains sanitizer_overhang.log f16/256/64/96 bf16/256/128/160 bf16/256/64/224 ;;
b)
  timeout 200 python3 bench/prototypes/consumers_probe.py --tiles --dtypes f16 \
    --chains 256/64/320,256/128/320,576/64/448,1000/64/320 2>&1 | grep -v -i warn \
    | tee "$OUT/tiles_320.log"
  timeout 200 python3 -m pytest -q -m gpu -n 8 tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_consumers_gpu.py 2>&1 | tail -3 | tee "$OUT/tests_320.log"
  sanitize_biased_chains sanitizer_320.log f16/256/64/320 bf16/256/128/320
  timeout 200 python3 bench/defaults.py --part 2 --dtype f16 --json "$OUT/own_chains.json" \
    --chains ${OWN_CHAINS:-256/96/256,256/96/384,256/32/384,512/96/128,384/32/512,256/64/640,256/128/448,768/64/320} \
    2>&1 | grep -v -i warn | tee "$OUT/own_chains.log" ;;
c)
  timeout 240 python3 -m pytest -q -m gpu -n 12 tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_consumers_gpu.py tests/gpu/test_b2b_gpu.py tests/gpu/test_chain_ring_gpu.py \
    2>&1 | tail -4 | tee "$OUT/tests_rs64.log"
  for ex in b2b_gemm_rf b2b_gemm_rf_bf16; do
    python3 -m kgen run examples/$ex.kg --arch sm_90a --size M=4097 2>&1 | grep -E "PASS|FAIL|ms"
    for tool in memcheck racecheck synccheck; do
      timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run \
        examples/$ex.kg --arch sm_90a --size M=1000 > /tmp/san.log 2>&1
      echo "$ex sm_90a M=1000 $tool exit=$? $(grep -E '^(PASS|FAIL)' /tmp/san.log | head -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
    done
  done 2>&1 | tee "$OUT/examples_rs64.log"
  sanitize_biased_chains sanitizer_rs64.log f16/256/96/256 bf16/256/32/384
  timeout 200 python3 bench/defaults.py --part 2 --dtype f16 --json "$OUT/own_chains_rs64.json" \
    --chains ${OWN_CHAINS:-256/96/256,256/96/384,256/32/384,512/96/128,384/32/512,256/64/640,256/128/448,768/64/320,256/160/128,256/32/128} \
    2>&1 | grep -v -i warn | tee "$OUT/own_chains_rs64.log" ;;
d)
  timeout 240 python3 -m pytest -q -m gpu -n 12 tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_consumers_gpu.py tests/gpu/test_b2b_gpu.py tests/gpu/test_chain_ring_gpu.py \
    tests/gpu/test_batches_gpu.py 2>&1 | tail -4 | tee "$OUT/tests_blocks.log"
  sanitize_biased_chains sanitizer_blocks.log f16/256/64/640 bf16/256/128/448
  timeout 200 python3 bench/prototypes/column_blocks_probe.py 2>&1 | grep -v -i warn \
    | tee "$OUT/column_blocks_probe.log"
  timeout 150 python3 bench/defaults.py --part 2 --dtype f16 --json "$OUT/own_chains_blocks.json" \
    --chains 256/64/640,256/128/448,576/48/320,256/160/320,576/64/1024 \
    2>&1 | grep -v -i warn | tee "$OUT/own_chains_blocks.log" ;;
esac
