#!/usr/bin/env bash
# One visit: clusters of 2x1 on the 4-stage cooperative 128x256 kernel (issues 15, 17), against
# the builder's default (1x1), bare over nine sizes and fused at 4096^3 and 8192^3, in turn, 3
# rounds (bench/epilogue_tile.py --variants). Run:
# bash .gpu/device-run.sh bash bench/cluster_s4_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
timeout 280 python3 bench/epilogue_tile.py --kernels bare --rounds 3 \
  --variants "s4 epilogue tile" "s4 cluster 2x1" \
  --sizes 4096,4096,4096 8192,8192,8192 2048,2048,2048 6144,5120,3072 3000,5000,2000 \
          16384,1024,1024 512,8192,8192 8192,8192,1024 2560,7168,4096 \
  --json "$OUT/cluster_bare.json" 2>&1 | grep -v Warning | tee "$OUT/cluster_bare.log"
timeout 280 python3 bench/epilogue_tile.py --rounds 3 \
  --kernels "C epilogue" "own: leaky*scale+bias" "own: gelu(acc+bias) bf16" \
  --variants "s3 whole tile" "s4 epilogue tile" "s4 cluster 2x1" "s3 cluster 2x1" \
  --sizes 4096,4096,4096 8192,8192,8192 \
  --json "$OUT/cluster_fused.json" 2>&1 | grep -v Warning | tee "$OUT/cluster_fused.log"
