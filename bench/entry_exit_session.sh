#!/usr/bin/env bash
# The sm_90a GEMM's entry and end (issue 17, this stop): tensor maps prefetched at entry, the end
# on the copy engine having read the last staging, and on clusters the producer's tail and the
# release from lane 0 of warp r. On the GPU machine:
#   bash .gpu/device-run.sh bash bench/entry_exit_session.sh
# The GPU suites these touch (clusters, the hopper GEMM, staged inputs, the ping-pong chains),
# then compute-sanitizer on clusters (both kinds, both shapes of cluster), a bare GEMM and a
# ping-pong chain. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
echo "== the GPU suites"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 tests/gpu/test_cluster_gpu.py \
  tests/gpu/test_hopper_gpu.py tests/gpu/test_b2b_gpu.py tests/gpu/test_chain_ring_gpu.py \
  > "$OUT/pytest_entry_exit.log" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_entry_exit.log" | head; tail -2 "$OUT/pytest_entry_exit.log"
echo "== compute-sanitizer"
kg() {  # a bf16 GEMM: $1 the cluster line, $2 a schedule line or nothing, $3 the epilogue
  cat > /tmp/ee.kg <<KG
kernel ee {
  target sm_90a
  $2
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  vector bias : f32[N]
  tensor D : bf16[M, N] row out
  gemm g = A @ B {
    $1
    epilogue { $3 }
  }
}
KG
}
kg "cluster 2x1" "" "D = acc"; sanitize /tmp/ee.kg "cooperative cluster 2x1"
kg "cluster 1x2" "schedule pingpong" "D = relu(acc + bias[col])"; sanitize /tmp/ee.kg "pingpong cluster 1x2 fused"
kg "cluster 2x1" "schedule pingpong" "D = acc"; sanitize /tmp/ee.kg "pingpong cluster 2x1"
kg "" "" "D = acc"; sanitize /tmp/ee.kg "cooperative no cluster"
for tool in memcheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run \
    examples/b2b_gemm_rf_pingpong_bf16_sm90a.kg --size M=1000 > /tmp/san.log 2>&1
  echo "chain pingpong M=1000 $tool exit=$? $(grep -E '^(PASS|FAIL)' /tmp/san.log | head -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
done | tee -a "$OUT/sanitizer.log"
