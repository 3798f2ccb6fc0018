#!/usr/bin/env bash
# One visit: the epilogue tile's staged C with its later boxes prefetched into L2 during the
# mainloop (issue 15): the epilogue-tile GPU tests and compute-sanitizer
# (bench/epilogue_tile_session.sh PART=tests), then the C epilogue on 3 stages (whole tile), 4
# (epilogue tile, prefetched) and 4 without the prefetch (a diagnostic text edit), in turn. Run:
# bash .gpu/device-run.sh bash bench/c_prefetch_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=tests bash "$(dirname "$0")/epilogue_tile_session.sh"
timeout 280 python3 bench/epilogue_tile.py --kernels "C epilogue" --rounds 3 \
  --variants "s3 whole tile" "s4 epilogue tile" "s4 no C prefetch" \
  --sizes 4096,4096,4096 8192,8192,8192 6144,5120,3072 8192,8192,4096 \
  --json "$OUT/c_prefetch.json" 2>&1 | grep -v Warning | tee "$OUT/c_prefetch.log"
