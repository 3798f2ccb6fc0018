#!/usr/bin/env bash
# One visit: the builder's default with the epilogue tile (128x256 on 4 stages) over the bare
# sweep of issue 17 (bench/wave_split.py --quick: the default, the sizes' choice, 128x256 s3,
# 128x192 s4), then the bare kernel at short K (bench/epilogue_tile.py). Run:
# bash .gpu/device-run.sh bash bench/epilogue_tile_sweep.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
echo "== bare sweep"
timeout 420 python3 bench/wave_split.py --part bare --quick --json "$OUT/sweep.json" 2>&1 \
  | grep -v Warning | tee "$OUT/sweep.log"
echo "== short K"
timeout 150 python3 bench/epilogue_tile.py --kernels bare --rounds 3 \
  --sizes 8192,8192,512 8192,8192,1024 2048,2048,2048 --json "$OUT/short_k.json" 2>&1 \
  | grep -v Warning | tee "$OUT/short_k.log"
