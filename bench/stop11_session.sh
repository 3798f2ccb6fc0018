#!/usr/bin/env bash
# The eleventh stop's GPU visits for issue 17, on the GPU machine through .gpu/device-run.sh
# (carry .whl and .gpu). Logs land in $OUT (bench/logs/stop11/ once fetched). STEP=
#   a  6ef1b61's plans on hardware (the split-row chains that keep their staging, 200/128/256
#      among them): the new GPU tests with the chain suites, compute-sanitizer on 200/128/256;
#      then what still bounds 256/128/256 (bench/prototypes/bound_probe.py)
#   b  bound_probe.py again with the staging's sync removed (-A -D1 -sync) and the per-warp
#      stores' prototype (warp stores), over seven of the issue's chains
#   c  every builder configuration of the K0 = 1000 chains whose B0 cannot stay resident
#      (chain_ring.py --one): is another kind than the streamed ping-pong faster there?
#   d  the whole `pytest -m gpu` on the final code (bench/gpu_tests.sh)
#   e  issue 17's done list, parts 1-3, from one visit (bench/defaults.py, as
#      bench/issue17_session.sh STEP=a)
#   f  the bare GEMM sweep after `kgen tune` at each shape (f16; bench/issue17_session.sh STEP=b)
#   g  how much of the chains' time over the copy is fixed per launch: M from 40960 to 327680
#      (bench/prototypes/fixed_cost_probe.py)
#   h  three consumer warpgroups at N0 = 128 with 160 registers each and early vectors, against
#      the builder's plan (bench/prototypes/three_at_160_probe.py)
. "$(dirname "$0")/session_head.sh"

case ${STEP:-a} in
a)
  timeout 220 python3 -m pytest -q -m gpu -n 14 -p no:cacheprovider \
    tests/gpu/test_passes_in_flight_gpu.py tests/gpu/test_split_rows_gpu.py \
    tests/gpu/test_early_vectors_gpu.py tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_chain_ring_gpu.py tests/gpu/test_consumers_gpu.py 2>&1 | tail -4 \
    | tee "$OUT/tests_chains.log"
  sanitize_biased_chains sanitizer_split_rows.log f16/200/128/256
  timeout 200 python3 bench/prototypes/bound_probe.py 2>&1 | grep -v -i warn \
    | tee "$OUT/bound.log" ;;
b)
  timeout 300 python3 bench/prototypes/bound_probe.py --chains f16/256/128/256,bf16/256/128/256,f16/256/128/128,f16/256/128/64,f16/576/128/256,f16/256/64/256,f16/256/64/64 2>&1 \
    | grep -v -i warn | tee "$OUT/bound_b.log" ;;
c)
  for chain in 1000,128,128 1000,160,256 1000,64,320; do
    timeout 120 python3 bench/chain_ring.py --one $chain 2>&1 | grep -v -i warn \
      | tee -a "$OUT/configs_k1000.log"
  done ;;
d)
  bash bench/gpu_tests.sh ;;
e)
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
  timeout 580 python3 bench/defaults.py --part 1 2 3 --json "$OUT/defaults.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/defaults.log" ;;
f)
  timeout 420 python3 bench/defaults.py --part 3 --tuned --dtype f16 \
    --json "$OUT/sweep_tuned.json" 2>&1 | grep -v -i warn | tee "$OUT/sweep_tuned.log" ;;
g)
  timeout 300 python3 bench/prototypes/fixed_cost_probe.py 2>&1 | grep -v -i warn \
    | tee "$OUT/fixed_cost.log" ;;
h)
  timeout 300 python3 bench/prototypes/three_at_160_probe.py 2>&1 | grep -v -i warn \
    | tee "$OUT/three_at_160.log" ;;
esac
