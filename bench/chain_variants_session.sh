#!/usr/bin/env bash
# The chain variants' visits of 2026-11-27 (on the GPU machine, through .gpu/device-run.sh), one
# of PART=
#   variants  bench/chain_variants.py over the issue's 24 chains and my own (the log's staged
#             columns ran at commit 7197e36), then compute-sanitizer on the two-in-flight
#             variant at M = 17 and 1000
#   clock     bench/prototypes/chain_clock.py on the final code (cycles per tile and phase)
#   probe     bench/chain_ring.py --one at 256/128/128 and 256/128/64 (every configuration)
#   example   the ping-pong B2B examples with one and two groups in flight
#   h200      bench/chain_variants.py over the issue's 24 chains alone
#   final     the builder's choice (two groups in flight by its rule): the issue's and my own
#             chains (bench/chain_ring.py --table), the B2B example, compute-sanitizer through
#             kgen run at M = 17 and 1000, the chain GPU suites
# Logs land in $OUT (bench/logs/chain_variants/ once fetched).
. "$(dirname "$0")/session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"

sanitize() {  # VARIANT "M ..." K0,N0,N1 ...
  local variant=$1 sizes=$2 shape m tool rc
  shift 2
  for shape in "$@"; do
    for m in $sizes; do
      for tool in memcheck racecheck synccheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 bench/chain_variants.py --once "$shape" --m $m --variant "$variant" >/tmp/san.log 2>&1
        rc=$?
        echo "$shape M=$m $variant $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checked|FAILED' /tmp/san.log | tail -2 | tr '\n' ' ')"
      done
    done
  done 2>&1 | tee -a "$OUT/sanitizers_variants.log"
}

case ${PART:-variants} in
variants)
  timeout 420 python3 bench/chain_variants.py --rounds 2 --shapes all --json "$OUT/variants.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/variants.log"
  sanitize 2 "17 1000" 256,128,128 576,64,256 ;;
clock)  # clock reads of the final code (bench/prototypes/chain_clock.py; not run this stop)
  timeout 200 python3 bench/prototypes/chain_clock.py 2>&1 | grep -v -i warn | tee "$OUT/chain_clock_final.log" ;;
probe)  # every configuration of the builder's list at two K0 = 256, N0 = 128 chains
  for shape in 256,128,128 256,128,64; do
    timeout 100 python3 bench/chain_ring.py --one $shape 2>&1 | grep -v -i warn
  done | tee "$OUT/probe_in_flight.log" ;;
example)  # one group against two on the ping-pong B2B examples
  timeout 200 python3 bench/chain_variants.py --rounds 3 --example examples/b2b_gemm_rf_pingpong_sm90a.kg \
    --example examples/b2b_gemm_rf_pingpong_bf16_sm90a.kg 2>&1 | grep -v -i warn | tee "$OUT/example_in_flight.log" ;;
h200)  # one group against two on the issue's chains (a visit that got an H200)
  timeout 400 python3 bench/chain_variants.py --rounds 2 --shapes issue --json "$OUT/variants_h200.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/variants_h200.log" ;;
final)
  (timeout 300 python3 bench/chain_ring.py --table --shapes all --json "$OUT/table_in_flight.json" \
    2>&1 | grep -v -i warn | tee "$OUT/table_in_flight.log")
  timeout 90 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/b2b_example.log"
  for shape in 256,128,64 256,64,256; do
    IFS=, read k0 n0 n1 <<<"$shape"
    python3 -c "import sys; sys.path.insert(0, '.'); from tests.kernels import B2B_CHAIN; print(B2B_CHAIN.format(t='f16', k0=$k0, n0=$n0, n1=$n1))" >/tmp/san_$k0.kg
    for m in 17 1000; do
      for tool in memcheck racecheck synccheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 -m kgen run /tmp/san_$k0.kg --arch sm_90a --size M=$m --iters 1 >/tmp/san.log 2>&1
        rc=$?
        echo "K0=$k0 N0=$n0 N1=$n1 M=$m $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
      done
    done
  done 2>&1 | tee "$OUT/sanitizers_final.log"
  for m in 17 1000; do
    for tool in memcheck racecheck synccheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run examples/b2b_gemm_rf_pingpong_sm90a.kg --size M=$m --iters 1 >/tmp/san.log 2>&1
      rc=$?
      echo "b2b_gemm_rf_pingpong_sm90a M=$m $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee -a "$OUT/sanitizers_final.log"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_b2b_gpu.py \
    tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_chain_ring_gpu.py tests/gpu/test_builder_gpu.py \
    2>&1 | tail -4 | tee "$OUT/tests_chain_variants.log" ;;
esac
