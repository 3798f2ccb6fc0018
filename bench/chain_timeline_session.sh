#!/usr/bin/env bash
# Where a ping-pong chain's launch spends its wall time, and the feed change end to end (on the
# GPU machine, through .gpu/device-run.sh), one of PART=
#   probe     bench/prototypes/chain_timeline.py alone
#   timeline  bench/prototypes/chain_timeline.py (globaltimer per CTA), then the issue's 24
#             chains (bench/chain_ring.py --table --shapes issue) with the code before the feed
#             change (commit cfecd8a, carried as .ab_old/, untracked: mkdir .ab_old && git archive
#             cfecd8a kgen templates grammar bench/chain_ring.py bench/b2b_bench.py bench/hopper_gemm.py
#             bench/session_head.sh tests/kernels.py pyproject.toml | tar -x -C .ab_old) and with
#             this tree, in turn
#   late      Schedule.resident_late (needs commit 66b0969: the experiment, reverted): the probe again, bench/resident_late.py (before / late, same
#             run), the chain GPU suites, compute-sanitizer on late chains at M = 17, 200, 1000
#             (warpgroups without tiles), and the B2B example (bench/b2b_bench.py)
#   stmatrix  the chain's staging by stmatrix: the issue's 24 chains before (.ab_old/ from commit
#             411ce07, made as above) and after, twice in turn; compute-sanitizer on three chains at
#             M = 17 and 1000; the chain GPU suites; the B2B example
# Logs land in $OUT (bench/logs/chain_timeline/ once fetched).
. "$(dirname "$0")/session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
case ${PART:-timeline} in
stmatrix)
  for round in 1 2; do
    (cd .ab_old && timeout 200 python3 bench/chain_ring.py --table --shapes issue \
      --json "$OUT/stm_before_$round.json" 2>&1 | grep -v -i warn | tee "$OUT/stm_before_$round.log")
    timeout 200 python3 bench/chain_ring.py --table --shapes issue --json "$OUT/stm_after_$round.json" \
      2>&1 | grep -v -i warn | tee "$OUT/stm_after_$round.log"
  done
  timeout 90 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/b2b_example_stm.log"
  for shape in 256,128,128 576,64,64 768,96,128; do
    IFS=, read k0 n0 n1 <<<"$shape"
    python3 -c "import sys; sys.path.insert(0, '.'); from tests.kernels import B2B_CHAIN; print(B2B_CHAIN.format(t='f16', k0=$k0, n0=$n0, n1=$n1))" >/tmp/stm_$k0.kg
    for m in 17 1000; do
      for tool in memcheck racecheck synccheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 -m kgen run /tmp/stm_$k0.kg --arch sm_90a --size M=$m --iters 1 >/tmp/san.log 2>&1
        rc=$?
        echo "K0=$k0 N0=$n0 N1=$n1 M=$m $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
      done
    done
  done 2>&1 | tee "$OUT/sanitizers_stm.log"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_b2b_gpu.py \
    tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_chain_ring_gpu.py tests/gpu/test_builder_gpu.py \
    2>&1 | tail -4 | tee "$OUT/tests_chain_stm.log" ;;
late)
  timeout 150 python3 bench/prototypes/chain_timeline.py 2>&1 | grep -v -i warn | tee "$OUT/timeline_late.log"
  timeout 400 python3 bench/resident_late.py --rounds 2 --json "$OUT/resident_late.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/resident_late.log"
  timeout 90 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/b2b_example.log"
  for shape in 256,128,128 576,64,64 1024,64,128; do
    IFS=, read k0 n0 n1 <<<"$shape"
    python3 -c "import sys; sys.path.insert(0, '.'); from tests.kernels import B2B_CHAIN; print(B2B_CHAIN.format(t='f16', k0=$k0, n0=$n0, n1=$n1))" >/tmp/late_$k0.kg
    for m in 17 200 1000; do
      for tool in memcheck racecheck synccheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 -m kgen run /tmp/late_$k0.kg --arch sm_90a --size M=$m --iters 1 >/tmp/san.log 2>&1
        rc=$?
        echo "K0=$k0 N0=$n0 N1=$n1 M=$m $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
      done
    done
  done 2>&1 | tee "$OUT/sanitizers_late.log"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_b2b_gpu.py \
    tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_chain_ring_gpu.py tests/gpu/test_builder_gpu.py \
    2>&1 | tail -6 | tee "$OUT/tests_chain_late.log" ;;
probe)
  timeout 200 python3 bench/prototypes/chain_timeline.py 2>&1 | grep -v -i warn | tee "$OUT/timeline${TAG:+_$TAG}.log" ;;
timeline)
  timeout 120 python3 bench/prototypes/chain_timeline.py 2>&1 | grep -v -i warn | tee "$OUT/timeline.log"
  for round in 1 2; do
    (cd .ab_old && timeout 200 python3 bench/chain_ring.py --table --shapes issue \
      --json "$OUT/table_before_$round.json" 2>&1 | grep -v -i warn | tee "$OUT/table_before_$round.log")
    timeout 200 python3 bench/chain_ring.py --table --shapes issue --json "$OUT/table_after_$round.json" \
      2>&1 | grep -v -i warn | tee "$OUT/table_after_$round.log"
    [ "${ROUNDS:-1}" = 1 ] && break
  done ;;
esac
