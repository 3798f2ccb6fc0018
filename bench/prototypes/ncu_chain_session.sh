#!/usr/bin/env bash
# Nsight Compute sections of one launch of two B2B chains: 256/128/128 (1.24x the copy on an
# H200) and 576/64/64 (1.10x); STALLS=1 adds the warps' stall reasons (SECTIONS= leaves the
# sections out). Run: bash .gpu/device-run.sh bash bench/prototypes/ncu_chain_session.sh
. "$(dirname "$0")/../session_head.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for chain in ${SECTIONS-256,128,128 576,64,64}; do
  echo "== $chain"
  timeout 200 "$NCU" --clock-control none --kernel-name regex:'^chain$' --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy \
    python3 bench/prototypes/ncu_chain.py --chain $chain 2>&1 | grep -v -i "warn" > "$OUT/ncu_chain_${chain//,/_}.log"
  tail -150 "$OUT/ncu_chain_${chain//,/_}.log" | grep -E "ms$|Throughput|Duration|Busy|Hit|Stall|Issued|Eligible|Active|Bandwidth|Pipe|%" | head -60
done
# Stall reasons of every warp (producer and consumers together), per issued instruction
if [ -n "${STALLS:-}" ]; then
  R=smsp__average_warps_issue_stalled
  M=""
  for r in long_scoreboard barrier membar short_scoreboard wait math_pipe_throttle mio_throttle \
           lg_throttle sleeping dispatch_stall selected not_selected branch_resolving no_instruction \
           drain imc_miss misc tex_throttle; do M="$M,${R}_${r}_per_issue_active.ratio"; done
  for chain in 256,128,128 576,64,64; do
    echo "== stalls $chain"
    timeout 200 "$NCU" --clock-control none --kernel-name regex:'^chain$' --launch-skip 3 --launch-count 1 \
      --metrics "${M#,}" python3 bench/prototypes/ncu_chain.py --chain $chain 2>&1 \
      | grep -E "stalled|ms$" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' \
      | tee "$OUT/ncu_stalls_${chain//,/_}.log"
  done
fi
