#!/usr/bin/env bash
# The chain variants' visit of 2026-11-27 (on the GPU machine, through .gpu/device-run.sh):
# bench/chain_variants.py over the issue's 24 chains and my own (the first gemm's column
# vectors staged once per CTA or read by every tile; one or two wgmma groups in flight), then
# compute-sanitizer on the staged, two-in-flight variant at M = 17 and 1000, then the chain
# GPU suites. Logs land in $OUT (bench/logs/chain_variants/ once fetched).
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
  sanitize staged/2 "17 1000" 256,128,128 576,64,256 ;;
suites)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_b2b_gpu.py \
    tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_chain_ring_gpu.py tests/gpu/test_builder_gpu.py \
    2>&1 | tail -4 | tee "$OUT/tests_chain_variants.log" ;;
esac
