#!/usr/bin/env bash
# Hardware counters of one launch of each bare-GEMM configuration (bench/prototypes/ncu_probe.py):
# DRAM bytes, L2 hit rate, time. Run: bash .gpu/device-run.sh bash bench/prototypes/ncu_session.sh
. "$(dirname "$0")/../session_head.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
while read -r tile stages size extra; do
  echo "== $tile s$stages $size $extra"
  timeout 120 "$NCU" --clock-control none --kernel-name regex:'^bare$' --launch-skip 3 --launch-count 1 \
    --metrics $METRICS --csv python3 bench/prototypes/ncu_probe.py --tile $tile --stages $stages \
    --size $size $extra > "$OUT/ncu_raw.tmp" 2>&1
  grep -E 'ms$|rror|FAILED' "$OUT/ncu_raw.tmp"
  grep -E '^"[0-9]' "$OUT/ncu_raw.tmp" | sed 's/.*","\([a-z_]*__[^"]*\)","\([^"]*\)","\([^"]*\)"$/  \1 \3 \2/' 
done <<'LIST' | tee "$OUT/ncu.log"
128x192 4 3000,5000,2000
128x256 4 3000,5000,2000
128x192 4 3000,5008,2000
128x256 4 3000,5008,2000
128x192 4 3000,5000,2048
128x256 4 4096,4096,11008
128x256 4 4096,4096,11008 --stream
128x256 4 1536,1536,6144
128x256 4 1536,1536,6144 --stream
LIST
