#!/usr/bin/env bash
# 128-row tiles of 144, 160 and 176 columns (bench/prototypes/tile_n_probe.py), one GPU visit:
#   PART=probe  the per-element costs and the grid against the sized choice
#   PART=rule   the wave model without and with the new widths, two rounds; 1608x1504 at K =
#               6992 and 7040 again (two rounds)
#   PART=check  the whole GPU suite (bench/gpu_tests.sh), then compute-sanitizer on 128x144 and
#               128x176 written, at ragged sizes
#   PART=cost128  the wave model with 128x128 weighed at 1.11 against 1.06, two rounds (not kept)
#   PART=wide   the 256-row tiles' costs per element on the same basis as PART=probe's
#   PART=splitc  split-K on clusters: the GPU tests, compute-sanitizer, and the sized split
#               against the same on a cluster 2x1 and 1x2 (two rounds)
#   PART=tail   the cluster GPU tests, and compute-sanitizer on a cluster 2x1 kernel's fast entry
#               and its narrow one with both operands by TMA (N 4001: the output's rows miss
#               16 bytes), which no longer runs the producer's tail
#   PART=profile  kernel device times of the sized split-K (main kernel and sum) and torch.matmul
#   PART=list   my own shapes with no schedule line, and after tune (f16)
# Logs land in $OUT (bench/logs/tile_n/ once fetched).
. "$(dirname "$0")/session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
case ${PART:-probe} in
probe)
  timeout 560 python3 bench/prototypes/tile_n_probe.py --part cost grid 2>&1 | grep -v -i warn \
    | tee "$OUT/probe.log" ;;
rule)
  timeout 120 python3 bench/prototypes/tile_n_probe.py --part recheck 2>&1 | grep -v -i warn \
    | tee "$OUT/recheck.log"
  timeout 420 python3 bench/prototypes/tile_n_probe.py --part rule 2>&1 | grep -v -i warn \
    | tee "$OUT/rule.log" ;;
check)
  bash bench/gpu_tests.sh
  for n in 144 176; do
    sed -e "s/128x256x64  warps 2x4  stages 3/128x${n}x64  warps 2x4  stages 4/" \
      -e "s/target sm_80/target sm_90a/" examples/gemm_bias_relu.kg > /tmp/tile_$n.kg
    grep -q "128x${n}x64" /tmp/tile_$n.kg || echo "tile line not replaced in /tmp/tile_$n.kg"
    sanitize /tmp/tile_$n.kg "gemm_bias_relu 128x$n"
  done ;;
cost128)
  timeout 500 python3 bench/prototypes/tile_n_probe.py --part cost128 2>&1 | grep -v -i warn \
    | tee "$OUT/cost128.log" ;;
wide)
  timeout 400 python3 bench/prototypes/tile_n_probe.py --part wide 2>&1 | grep -v -i warn \
    | tee "$OUT/wide.log" ;;
splitc)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 tests/gpu/test_cluster_gpu.py \
    tests/gpu/test_any_shape_gpu.py 2>&1 | tail -5 | tee "$OUT/pytest_splitc.log"
  sed -e "s/128x256x64  warps 2x4  stages 3/128x128x64  warps 2x4  stages 5 split 2 cluster 2x1/" \
    -e "s/target sm_80/target sm_90a/" examples/gemm_bias_relu.kg > /tmp/split_c.kg
  grep -q "cluster 2x1" /tmp/split_c.kg || echo "tile line not replaced in /tmp/split_c.kg"
  sanitize /tmp/split_c.kg "gemm_bias_relu 128x128 split 2 cluster 2x1"
  timeout 200 python3 bench/prototypes/tile_n_probe.py --part splitc 2>&1 | grep -v -i warn \
    | tee "$OUT/splitc.log" ;;
tail)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 tests/gpu/test_cluster_gpu.py \
    2>&1 | tail -5 | tee "$OUT/pytest_tail.log"
  sed -e "s/128x256x64  warps 2x4  stages 3/128x256x64  warps 2x4  stages 4 cluster 2x1/" \
    -e "s/target sm_80/target sm_90a/" examples/gemm_bias_relu.kg > /tmp/cluster.kg
  grep -q "cluster 2x1" /tmp/cluster.kg || echo "tile line not replaced in /tmp/cluster.kg"
  sanitize /tmp/cluster.kg "gemm_bias_relu 128x256 cluster 2x1"
  sanitize /tmp/cluster.kg "gemm_bias_relu 128x256 cluster 2x1 narrow" 2199,4001,1000 ;;
profile)
  timeout 200 python3 bench/prototypes/tile_n_probe.py --part profile 2>&1 | grep -v -i warn \
    | tee "$OUT/profile.log" ;;
list)
  timeout 160 python3 bench/defaults.py --part 3 --shapes own --json "$OUT/own.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/own.log"
  timeout 300 python3 bench/defaults.py --part 3 --tuned --shapes own --dtype f16 \
    --json "$OUT/own_tuned.json" 2>&1 | grep -v -i warn | tee "$OUT/own_tuned.log" ;;
esac
