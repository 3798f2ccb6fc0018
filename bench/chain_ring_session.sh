#!/usr/bin/env bash
# A visit for sm_90a's ping-pong chains with short rings (the consumers take turns) and with B0
# streamed through the ring: PART=tests: their GPU tests beside the chain and builder ones,
# then compute-sanitizer on a streamed and a turn-taking resident chain; PART=probe: every
# sm_90a configuration of the builder's list on the issue's and this script's chains (f16);
# PART=table: the builder's choices, both dtypes; PART=all: everything.
# Run: bash .gpu/device-run.sh bash bench/chain_ring_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
mkchain() {  # K0 N0 N1 STAGES RESIDENT0(0|1) > file: the test chain with its schedule lines
  python3 - "$@" <<'PY'
import sys
sys.path.insert(0, ".")
from tests.kernels import B2B_CHAIN
k0, n0, n1, ring, resident = map(int, sys.argv[1:])
t = B2B_CHAIN.format(t="f16", k0=k0, n0=n0, n1=n1)
t = t.replace("  target sm_90a\n", "  target sm_90a\n  schedule pingpong\n")
t = t.replace("gemm g0 = A @ B0 accumulate f32 {", "gemm g0 = A @ B0 accumulate f32 {\n"
              f"    tile 64x{n0}x64 warps 4x1 stages {ring}" + ("\n    keep B0 resident" if resident else ""))
t = t.replace("gemm g1 = g0 @ B1 accumulate f32 {", "gemm g1 = g0 @ B1 accumulate f32 {\n"
              f"    tile 64x{n1}x64 warps 4x1 stages 2\n    keep B1 resident")
print(t)
PY
}
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  echo "== pytest: short rings and streamed B0, the chains, the builder's choices"
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest tests/gpu/test_chain_ring_gpu.py \
    tests/gpu/test_b2b_gpu.py tests/gpu/test_builder_gpu.py -m gpu -q -p no:cacheprovider \
    2>&1 | tail -25 | tee "$OUT/pytest_chain_ring.log"
  mkchain 576 128 128 4 0 > /tmp/ring_b.kg
  mkchain 576 64 64 3 1 > /tmp/turns.kg
  for kg in ring_b turns; do
    for tool in memcheck racecheck synccheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run /tmp/$kg.kg --size M=1000 --iters 1 >/tmp/san.log 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$kg M=1000 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/sanitizers_chain_ring.log"
fi
if [ "$PART" = probe ] || [ "$PART" = all ]; then
  echo "== every sm_90a configuration, f16"
  chains=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import chain_ring as c; print(' '.join(','.join(map(str, s)) for s in c.ISSUE + c.OWN))")
  for one in ${SHAPES:-$chains}; do  # one process per chain: a failed launch ends only its own
    timeout 120 python3 bench/chain_ring.py --one $one --json "$OUT/probe_${one//,/_}.json" 2>&1 \
      | grep -v -i warn
  done | tee "$OUT/chain_ring_probe.log"
fi
if [ "$PART" = table ] || [ "$PART" = all ]; then
  echo "== the builder's choices, f16 and bf16"
  timeout 400 python3 bench/chain_ring.py --table --json "$OUT/chain_ring_table.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/chain_ring_table.log"
  echo "== the b2b example (ping-pong, f16 and bf16): no slower than 0.0349 ms"
  timeout 120 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -20 | tee "$OUT/b2b_example.log"
fi
