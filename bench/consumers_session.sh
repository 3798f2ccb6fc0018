#!/usr/bin/env bash
# Three consumer warpgroups in the ping-pong chain (schedules.consumer_count), on the GPU machine
# through .gpu/device-run.sh: the rule's edges timed against two warpgroups
# (bench/prototypes/consumers_probe.py), the chain GPU suites, compute-sanitizer on three-consumer
# chains, then issue 17's done list (bench/defaults.py parts 1-2: the examples without their
# schedule lines and the 24 chains). Logs land in $OUT (bench/logs/consumers/ once fetched).
# STEP=a: the probe, the suites and the sanitizers; STEP=b: N1 = 192's tiles and the done list;
# STEP=c: N1 = 192 again after the shorter rings, and the chain shapes' GPU suite; STEP=d: N1 of
# 384 and 512 in column passes; STEP=e: N1 of 96, 160, 224 on whole boxes clipped at N.
. "$(dirname "$0")/session_head.sh"
if [ "${STEP:-a}" = e ]; then  # N1 not a multiple of 64: whole boxes clipped at N, by TMA
  timeout 200 python3 bench/prototypes/consumers_probe.py --tiles \
    --chains 256/64/96,256/64/160,256/128/160,256/64/224,576/128/96 2>&1 | grep -v -i warn \
    | tee "$OUT/tiles_overhang.log"
  timeout 200 python3 -m pytest -q -m gpu -n 8 tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_consumers_gpu.py 2>&1 | tail -3 | tee "$OUT/tests_overhang.log"
  exit
fi
if [ "${STEP:-a}" = d ]; then  # N1 of 384 and 512: column passes of 128 against the tiled chain
  timeout 250 python3 bench/prototypes/consumers_probe.py --tiles \
    --chains 256/64/384,256/128/384,576/64/512,256/64/512 2>&1 | grep -v -i warn \
    | tee "$OUT/tiles_wide.log"
  timeout 200 python3 -m pytest -q -m gpu -n 8 tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_consumers_gpu.py tests/gpu/test_chain_ring_gpu.py 2>&1 | tail -3 \
    | tee "$OUT/tests_wide.log"
  exit
fi
if [ "${STEP:-a}" = c ]; then  # N1 = 192 after configs.short_rings, and its GPU test
  timeout 150 python3 bench/prototypes/consumers_probe.py --tiles 2>&1 | grep -v -i warn \
    | tee "$OUT/tiles_192_short.log"
  timeout 200 python3 -m pytest -q -m gpu -n 8 tests/gpu/test_chain_shapes_gpu.py \
    tests/gpu/test_consumers_gpu.py 2>&1 | tail -3 | tee "$OUT/tests_192.log"
  exit
fi
if [ "${STEP:-a}" = b ]; then
  timeout 150 python3 bench/prototypes/consumers_probe.py --tiles 2>&1 | grep -v -i warn \
    | tee "$OUT/tiles_192.log"
  timeout 400 python3 bench/defaults.py --part 1 2 --json "$OUT/defaults.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/defaults.log"
  exit
fi
timeout 200 python3 bench/prototypes/consumers_probe.py --dtypes f16 2>&1 | grep -v -i warn \
  | tee "$OUT/consumers_edges.log"
timeout 200 python3 -m pytest -q -m gpu -n 8 tests/gpu/test_consumers_gpu.py \
  tests/gpu/test_chain_ring_gpu.py tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_b2b_gpu.py \
  2>&1 | tail -5 | tee "$OUT/tests_consumers.log"
python3 - <<'PY'
from tests.kernels import B2B_CHAIN
for name, (t, k0, n0, n1) in {"c3_f16": ("f16", 256, 64, 128), "c3_bf16": ("bf16", 256, 64, 256)}.items():
    open(f"/tmp/{name}.kg", "w").write(B2B_CHAIN.format(t=t, k0=k0, n0=n0, n1=n1))
PY
for kg in c3_f16 c3_bf16; do
  for m in 17 1000; do
    for tool in memcheck racecheck synccheck; do
      timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run /tmp/$kg.kg \
        --size M=$m > /tmp/san.log 2>&1
      echo "$kg M=$m $tool exit=$? $(grep -E '^(PASS|FAIL)' /tmp/san.log | head -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
    done
  done
done | tee "$OUT/sanitizer.log"
