#!/usr/bin/env bash
# The tenth stop's GPU visits for issue 17, on the GPU machine through .gpu/device-run.sh
# (carry .whl and .gpu). Logs land in $OUT (bench/logs/stop10/ once fetched). STEP=
#   a  after g0's column vectors are loaded before its mainloop (GemmSchedule.early_vectors):
#      the chain GPU suites with the new test_early_vectors_gpu.py and the batched ones,
#      compute-sanitizer on two such chains, the issue's 24 chains (bench/defaults.py --part 2),
#      chains of my own, and every builder configuration at 256/128/256 (chain_ring.py --one)
#   b  after two column passes in flight (GemmSchedule.passes_in_flight) and N0 = 160 with
#      N1 = 256 on the ping-pong chain: both values of passes_in_flight in turn
#      (schedule_value_probe.py), the new GPU tests and the chain suites, compute-sanitizer on
#      two such chains, the issue's 24 chains and chains of my own
#   c  K0 = 1000 (rows of 2000 bytes, 16-byte but not 32-byte multiples): the L2 promotion of
#      the A and the B0 tensor maps, each in turn (schedule_value_probe.py --map)
#   d  after 128-byte promotion on the ring's maps: every builder configuration at 1000/64/64 and
#      1000/64/128 (B0 resident against streamed where its rows split 32-byte sectors), then the
#      issue's 24 chains
#   e  the whole `pytest -m gpu` (bench/gpu_tests.sh), compute-sanitizer on a chain that keeps
#      B0 resident for its split rows, then chains of my own
. "$(dirname "$0")/session_head.sh"

OWN=256/96/256,256/96/384,256/32/384,384/32/512,256/64/320,576/64/448,256/128/320,1000/64/320,256/64/640,256/128/448,576/48/320,256/160/320,256/112/320,576/64/1024

case ${STEP:-a} in
a)
  timeout 200 python3 -m pytest -q -m gpu -n 14 tests/gpu/test_early_vectors_gpu.py \
    tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_consumers_gpu.py tests/gpu/test_b2b_gpu.py \
    tests/gpu/test_chain_ring_gpu.py tests/gpu/test_batches_gpu.py 2>&1 | tail -4 \
    | tee "$OUT/tests_early.log"
  sanitize_biased_chains sanitizer_early.log f16/256/128/64 bf16/256/160/320
  timeout 150 python3 bench/defaults.py --part 2 --json "$OUT/defaults_chains.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/defaults_chains.log"
  timeout 100 python3 bench/defaults.py --part 2 --dtype f16 --json "$OUT/own_chains.json" \
    --chains $OWN 2>&1 | grep -v -i warn | tee "$OUT/own_chains.log"
  timeout 100 python3 bench/chain_ring.py --one 256,128,256 2>&1 | grep -v -i warn \
    | tee "$OUT/configs_256_128_256.log" ;;
b)
  timeout 200 python3 bench/prototypes/schedule_value_probe.py --field passes_in_flight \
    --values 2,1 2>&1 | grep -v -i warn | tee "$OUT/passes_in_flight.log"
  timeout 150 python3 -m pytest -q -m gpu -n 14 tests/gpu/test_passes_in_flight_gpu.py \
    tests/gpu/test_early_vectors_gpu.py tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_chain_ring_gpu.py 2>&1 | tail -4 | tee "$OUT/tests_passes.log"
  sanitize_biased_chains sanitizer_passes.log f16/256/128/256 bf16/256/128/320 f16/256/160/256
  timeout 150 python3 bench/defaults.py --part 2 --json "$OUT/defaults_chains.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/defaults_chains.log"
  timeout 100 python3 bench/defaults.py --part 2 --dtype f16 --json "$OUT/own_chains.json" \
    --chains $OWN,256/160/256,1000/160/256 2>&1 | grep -v -i warn | tee "$OUT/own_chains.log"
  timeout 90 python3 bench/chain_ring.py --one 256,160,256 2>&1 | grep -v -i warn \
    | tee "$OUT/configs_256_160_256.log" ;;
c)
  for param in A B0; do
    timeout 150 python3 bench/prototypes/schedule_value_probe.py --map $param \
      --field load_promotion --values "'L2_256B','L2_128B','L2_64B','NONE'" --dtypes f16 \
      --chains 1000/64/320,1000/160/256,1000/64/64,1000/128/128,1024/64/320 2>&1 \
      | grep -v -i warn | tee "$OUT/promotion_$param.log"
  done ;;
d)
  for chain in 1000,64,64 1000,64,128; do
    timeout 100 python3 bench/chain_ring.py --one $chain 2>&1 | grep -v -i warn \
      | tee -a "$OUT/configs_k1000.log"
  done
  timeout 150 python3 bench/defaults.py --part 2 --json "$OUT/defaults_chains.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/defaults_chains.log" ;;
e)
  bash bench/gpu_tests.sh
  sanitize_biased_chains sanitizer_split_rows.log f16/1000/64/64
  timeout 120 python3 bench/defaults.py --part 2 --dtype f16 --json "$OUT/own_chains.json" \
    --chains $OWN,256/160/256,1000/160/256,1000/64/64,1000/64/128,1000/64/256,1000/32/128,200/64/64,1000/128/128 \
    2>&1 | grep -v -i warn | tee "$OUT/own_chains.log" ;;
esac
