#!/usr/bin/env bash
# A visit for chains of any shape (issue 17): PART=tests: their GPU tests beside the any-shape
# and b2b ones, then compute-sanitizer on a new chain and an sm_80 column-major output;
# PART=bench: the new chain shapes against the PyTorch chain (bench/chain_ring.py --table
# --shapes new); PART=all: both. At commit 58d29bc it also ran the sm_80 column-major 16-byte
# chunks (tests/gpu/test_sm80_col_output_gpu.py, bench/sm80_col_output.py), since removed.
# Run: bash .gpu/device-run.sh bash bench/any_chain_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  echo "== pytest: chain shapes, any shape, b2b"
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_any_shape_gpu.py tests/gpu/test_b2b_gpu.py \
    -m gpu -q -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/pytest_shapes.log"
  for run in "bench/kernels/gemm_col_out_sm80.kg M=1000,N=264,K=136" \
             "bench/kernels/gemm_col_out_sm80.kg M=1001,N=264,K=136" \
             "bench/kernels/chain_48_8.kg M=1000 --arch sm_80" \
             "bench/kernels/chain_48_8.kg M=1000"; do
    set -- $run
    for tool in memcheck racecheck synccheck; do
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$1" --size "$2" ${3:-} ${4:-} --iters 1 >/tmp/san.log 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$run $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/sanitizers_shapes.log"
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  echo "== chains that did not plan before, against the PyTorch chain"
  timeout 200 python3 bench/chain_ring.py --table --shapes new --json "$OUT/chain_new.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/chain_new.log"
fi
