#!/usr/bin/env bash
# Why do our clusters lose at the sweep's small launches while cuBLAS's win there? ncu's warp-state
# and source sections, with the per-instruction warp-stall samples, of ping-pong 64x64 s12 alone
# and on a 2x1 cluster at 128x4096x4096 (bench/prototypes/small_launch_probe.py --part ncu). The
# source pages (SASS with stall samples) come back as gzipped CSV; the reports stay in /tmp.
# Run: bash .gpu/device-run.sh bash bench/prototypes/cluster_stalls_session.sh
. "$(dirname "$0")/../session_head.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in "pp 64x64 s12" "pp 64x64 s12 c2x1"; do
  tag=$(echo "$v" | tr ' ' '_')
  timeout 200 "$NCU" --clock-control none --kernel-name regex:'^bare$' --section WarpStateStats \
    --section SourceCounters --section SpeedOfLight --import-source no -o "/tmp/$tag" \
    python3 bench/prototypes/small_launch_probe.py --part ncu --shape 128x4096x4096 \
    --variants "$v" > /tmp/ncu.log 2>&1
  echo "$v: ncu exit $?"
  "$NCU" -i "/tmp/$tag.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/source_$tag.csv.gz"
  "$NCU" -i "/tmp/$tag.ncu-rep" --page details 2>&1 | grep -E "Duration|Warp Cycles|stalled" | tee -a "$OUT/details.log"
done
