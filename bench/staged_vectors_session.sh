#!/usr/bin/env bash
# A visit for the epilogue vectors staged in shared memory (GemmSchedule.staged_vectors):
# PART=tests: their GPU tests beside the staged-input, column-major, cluster and batched ones,
# then compute-sanitizer on a kernel with row and column vectors; PART=bench: the batched
# probe (the plan, the Schedule value off, the bound) and bench/batched.py; PART=all: both.
# Run: bash .gpu/device-run.sh bash bench/staged_vectors_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
cat > /tmp/vectors.kg <<'KG'
kernel vectors {
  target sm_90a
  tensor A : f16[L, M, K] row
  tensor B : f16[L, K, N] col
  tensor D : f16[L, M, N] row out
  vector bias : f32[L, N]
  vector scale : bf16[M]
  scalar alpha : f32 = 1.0
  gemm g = A @ B accumulate f32 {
    epilogue { D = relu(alpha * acc + bias[col]) * scale[row] }
  }
}
KG
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  echo "== pytest: staged vectors, staged input, column-major outputs, clusters, batches"
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest tests/gpu/test_staged_vectors_gpu.py \
    tests/gpu/test_staged_input_gpu.py tests/gpu/test_col_output_gpu.py \
    tests/gpu/test_cluster_gpu.py tests/gpu/test_batches_gpu.py -m gpu -q -p no:cacheprovider \
    2>&1 | tail -25 | tee "$OUT/pytest_staged_vectors.log"
  for size in L=3,M=300,N=264,K=136 L=2,M=77,N=131,K=1001; do
    for tool in memcheck racecheck synccheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run /tmp/vectors.kg --size $size --iters 1 >/tmp/san.log 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "vectors $size $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/sanitizers_staged_vectors.log"
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  echo "== batched probe: as planned, the Schedule value off, the bias load left out"
  timeout 240 python3 bench/prototypes/batched_probe.py --edits --variants "coop 128x256 s3" \
    "pingpong 128x128 s5" "coop 128x128 s6" 2>&1 | grep -v -i warn | tee "$OUT/probe_edits.log"
  echo "== bench/batched.py"
  timeout 240 python3 bench/batched.py --json "$OUT/batched.json" 2>&1 | grep -v -i warn \
    | tee "$OUT/batched.log"
fi
