#!/usr/bin/env bash
# The chain visits of 2026-11-27 (on the GPU machine, through .gpu/device-run.sh), one of PART=
#   probe     bench/prototypes/chain_timeline.py alone (globaltimer per CTA)
#   timeline  the probe, then the issue's 24 chains (bench/chain_ring.py --table --shapes issue)
#             with the code before the feed change and with this tree, in turn. The code before
#             is carried as .ab_old/ (untracked): mkdir .ab_old && git archive cfecd8a kgen
#             templates grammar bench/chain_ring.py bench/b2b_bench.py bench/hopper_gemm.py
#             bench/session_head.sh tests/kernels.py pyproject.toml | tar -x -C .ab_old
#   late      Schedule.resident_late (needs commit 66b0969: the experiment, reverted): the probe,
#             bench/resident_late.py (before / late, same run), the B2B example, compute-sanitizer
#             at M = 17, 200, 1000 (warpgroups without tiles), the chain GPU suites
#   stmatrix  the chain's staging by stmatrix: the issue's 24 chains before (.ab_old/ from commit
#             411ce07, made as above) and after, twice in turn; the B2B example; compute-sanitizer
#             at M = 17 and 1000; the chain GPU suites
#   passes    the last gemm in column passes: bench/column_passes.py, the issue's 24 chains,
#             compute-sanitizer at M = 17 and 1000, the chain GPU suites
#   passes64  two passes beside N0 = 64 too: the issue's and my own chains (--shapes all),
#             compute-sanitizer at M = 17 and 1000, the chain GPU suites
# Logs land in $OUT (bench/logs/chain_timeline/, chain_stmatrix/, column_passes/ once fetched).
. "$(dirname "$0")/session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"

probe() {  # TAG
  timeout 150 python3 bench/prototypes/chain_timeline.py 2>&1 | grep -v -i warn | tee "$OUT/timeline${1:+_$1}.log"
}
table() {  # NAME [DIR]: the issue's 24 chains, the builder's choice, with the tree in DIR
  (cd "${2:-.}" && timeout 200 python3 bench/chain_ring.py --table --shapes issue --json "$OUT/$1.json" \
    2>&1 | grep -v -i warn | tee "$OUT/$1.log")
}
example() {  # TAG: the B2B examples (bench/b2b_bench.py)
  timeout 90 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/b2b_example${1:+_$1}.log"
}
sanitize() {  # TAG "M ..." K0,N0,N1 ...: memcheck, racecheck, synccheck on f16 chains with no schedule line
  local tag=$1 sizes=$2 shape k0 n0 n1 m tool rc
  shift 2
  for shape in "$@"; do
    IFS=, read k0 n0 n1 <<<"$shape"
    python3 -c "import sys; sys.path.insert(0, '.'); from tests.kernels import B2B_CHAIN; print(B2B_CHAIN.format(t='f16', k0=$k0, n0=$n0, n1=$n1))" >/tmp/san_$k0.kg
    for m in $sizes; do
      for tool in memcheck racecheck synccheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 -m kgen run /tmp/san_$k0.kg --arch sm_90a --size M=$m --iters 1 >/tmp/san.log 2>&1
        rc=$?  # before any command substitution in the echo resets $?
        echo "K0=$k0 N0=$n0 N1=$n1 M=$m $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
      done
    done
  done 2>&1 | tee "$OUT/sanitizers_$tag.log"
}
suites() {  # TAG: the chain GPU suites
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_b2b_gpu.py \
    tests/gpu/test_chain_shapes_gpu.py tests/gpu/test_chain_ring_gpu.py tests/gpu/test_builder_gpu.py \
    2>&1 | tail -4 | tee "$OUT/tests_chain_$1.log"
}

case ${PART:-timeline} in
probe) probe "${TAG:-}" ;;
timeline)
  probe ""
  table table_before_1 .ab_old
  table table_after_1 ;;
late)
  probe late
  timeout 400 python3 bench/resident_late.py --rounds 2 --json "$OUT/resident_late.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/resident_late.log"
  example ""
  sanitize late "17 200 1000" 256,128,128 576,64,64 1024,64,128
  suites late ;;
stmatrix)
  for round in 1 2; do
    table stm_before_$round .ab_old
    table stm_after_$round
  done
  example stm
  sanitize stm "17 1000" 256,128,128 576,64,64 768,96,128
  suites stm ;;
passes)
  timeout 300 python3 bench/column_passes.py --rounds 2 --json "$OUT/column_passes.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/column_passes.log"
  table table_passes
  sanitize passes "17 1000" 256,128,256 576,128,256
  suites passes ;;
passes64)
  (timeout 300 python3 bench/chain_ring.py --table --shapes all --json "$OUT/table_passes64.json" \
    2>&1 | grep -v -i warn | tee "$OUT/table_passes64.log")
  sanitize passes64 "17 1000" 256,64,256
  suites passes64 ;;
esac
