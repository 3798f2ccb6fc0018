#!/usr/bin/env bash
# Issue 17's done list from one visit on the current code (on the GPU machine, through
# .gpu/device-run.sh), one of STEP=
#   a  bench/defaults.py parts 1-3: every GEMM/EVT example without its schedule lines against the
#      example as written (sm_80 code and sm_90a), the issue's 24 B2B chains with no schedule
#      line (x PyTorch, / copy), the bare GEMM sweep with no schedule line (f16, bf16)
#   b  the sweep after `kgen tune` at each shape (f16), and shapes of my own never tuned for
#   c  bench/tune_bench.py: hand, builder and tuned schedules of the examples at 4096^3, and the
#      tune's wall time (<= 50 candidates); my own shapes after kgen tune (f16)
#   probe  bench/prototypes/tail_probe.py and tail_probe2.py (stream-K, ragged N, clusters on
#      64-row tiles)
# Logs land in $OUT (bench/logs/issue17_final/ once fetched).
. "$(dirname "$0")/session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
case ${STEP:-a} in
a)
  timeout 580 python3 bench/defaults.py --part 1 2 3 --json "$OUT/defaults.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/defaults.log" ;;
b)
  timeout 400 python3 bench/defaults.py --part 3 --tuned --dtype f16 --json "$OUT/sweep_tuned.json" \
    2>&1 | grep -v -i warn | tee "$OUT/sweep_tuned.log"
  timeout 150 python3 bench/defaults.py --part 3 --shapes own --json "$OUT/own.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/own.log" ;;
c)
  timeout 400 python3 bench/tune_bench.py --arch sm_90a --size M=4096,N=4096,K=4096 \
    --rounds 2 --json "$OUT/tune_bench.json" 2>&1 | grep -v -i warn | tee "$OUT/tune_bench.log"
  timeout 180 python3 bench/defaults.py --part 3 --tuned --shapes own --dtype f16 \
    --json "$OUT/own_tuned.json" 2>&1 | grep -v -i warn | tee "$OUT/own_tuned.log" ;;
probe)
  timeout 200 python3 bench/prototypes/tail_probe.py 2>&1 | grep -v -i warn | tee "$OUT/tail_probe.log"
  timeout 200 python3 bench/prototypes/tail_probe2.py 2>&1 | grep -v -i warn | tee "$OUT/tail_probe2.log" ;;
esac
