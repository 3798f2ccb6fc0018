#!/usr/bin/env bash
# K = 8 (mod 16) (issue 17), one of STEP=
#   probe  what cuBLAS runs there (bench/prototypes/cublas_kernels.py --misaligned), kgen's
#          variants (bench/prototypes/misaligned_probe.py), and Nsight Compute's memory sections
#          of one launch of 128x256 s4 at K = 1000 (rows 16-byte), 1008 (32) and 1024 (128)
#   combo  misaligned_probe.py --part combo sweep: clusters with each L2 promotion; the sweep
#          under both promotions
#   rule   misaligned_probe.py --part rule nn: the sized rule before and after
#   check  misaligned_probe.py --part rule2; the rule's GPU tests and the cluster, builder and
#          tune suites; compute-sanitizer on the rule's two clusters at ragged sizes
#   tests  the rule's GPU tests and the tune suite (check's pytest ran out of time before them);
#          bench/defaults.py part 1 (the examples without schedule lines against as written)
#   mn     misaligned_probe.py --part mn rule32: a row-major B on each cluster (B's MN-major
#          boxes multicast, new), and a cluster 2x1 where B's rows are 32- but not 128-byte
#          multiples; the shared MN-major operand's GPU tests
#   lines  misaligned_probe.py --part check (the product path against the rule before, at shapes
#          never probed); the cluster suite and the builder's line-rule GPU tests;
#          compute-sanitizer on a row-major B's cluster 2x1 (its MN-major boxes shared)
#   gap    misaligned_probe.py --part gap: where the line rule lost (2560x7168) and the sweep's
#          3000x5000x2000, on each tile and cluster (not run yet)
# Run: STEP=... bash .gpu/device-run.sh bash bench/prototypes/misaligned_session.sh
. "$(dirname "$0")/../session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
probe() { timeout "$1" python3 bench/prototypes/misaligned_probe.py --part "${@:3}" 2>&1 \
  | grep -v -i warn | tee "$OUT/$2.log"; }
case ${STEP:-probe} in
probe)
  timeout 120 python3 bench/prototypes/cublas_kernels.py --misaligned 2>&1 | grep -v -i warn \
    | tee "$OUT/cublas_misaligned.log"
  probe 330 misaligned_probe k variants promotion
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  for k in 1000 1008 1024; do
    echo "== ncu 128x256 s4 5000,3000,$k"
    timeout 150 "$NCU" --clock-control none --kernel-name regex:'^bare$' --launch-skip 3 \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      python3 bench/prototypes/ncu_probe.py --tile 128x256 --stages 4 --size 5000,3000,$k 2>&1 \
      | grep -v -i "warn" > "$OUT/ncu_k$k.log"
    grep -E "ms$|Duration|Throughput|Hit Rate|Busy" "$OUT/ncu_k$k.log" | head -20
  done ;;
combo) probe 560 combo_sweep combo sweep ;;
rule) probe 560 rule_nn rule nn ;;
check)
  probe 200 rule2 rule2
  timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_cluster_gpu.py \
    tests/gpu/test_builder_gpu.py tests/gpu/test_tune_gpu.py 2>&1 | tail -8 | tee "$OUT/pytest_gpu.log"
  for case in "col 2199,4000,1000" "row 2199,4008,1000"; do
    set -- $case
    sed "s/\[K, N\] col/[K, N] $1/" <<<"$(python3 -c 'import sys; sys.path.insert(0, "bench"); from defaults import BARE; print(BARE.format(t="f16"))')" > /tmp/sector_$1.kg
    IFS=, read -r m n k <<<"$2"
    for tool in memcheck racecheck synccheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run /tmp/sector_$1.kg \
        --size M=$m,N=$n,K=$k > /tmp/san.log 2>&1
      echo "B $1 $2 $tool exit=$? $(grep -E '^(PASS|FAIL)|cluster' /tmp/san.log | head -2 | tr '\n' ' ') $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
    done
  done | tee "$OUT/sanitizer.log" ;;
tests)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tune_gpu.py \
    tests/gpu/test_builder_gpu.py -k "sectors or tune or load or write or fifty" 2>&1 | tail -8 \
    | tee "$OUT/pytest_gpu_tests.log"
  timeout 200 python3 bench/defaults.py --part 1 --json "$OUT/defaults.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/defaults.log" ;;
mn)
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_cluster_gpu.py \
    -k "shared_mn_major" 2>&1 | tail -6 | tee "$OUT/pytest_mn.log"
  probe 440 mn_rule32 mn rule32 ;;
gap) probe 400 gap gap ;;
lines)
  probe 200 check check
  timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_cluster_gpu.py \
    tests/gpu/test_builder_gpu.py -k "cluster_gpu or split_lines" 2>&1 | tail -6 \
    | tee "$OUT/pytest_lines.log"
  python3 -c 'import sys; sys.path.insert(0, "bench"); from defaults import BARE; print(BARE.format(t="f16"))' \
    | sed "s/\[K, N\] col/[K, N] row/" > /tmp/lines_row.kg
  for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run /tmp/lines_row.kg \
      --size M=2199,N=4008,K=1000 > /tmp/san.log 2>&1
    echo "row 2199,4008,1000 $tool exit=$? $(grep -E '^(PASS|FAIL)|cluster' /tmp/san.log | head -2 | tr '\n' ' ') $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
  done | tee "$OUT/sanitizer.log" ;;
esac
