#!/usr/bin/env bash
# Diagnostic: Nsight Compute on the narrow entry point (K % 8 = 4: 8-byte copies), sm_90a and
# sm_80 code, with the fast entry point at 4096^3 beside them. Run on the device:
#   OUT=$OUT bash .gpu/device-run.sh bash bench/prototypes/narrow_ncu.sh
set -u
out=${OUT:-/tmp}
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters --section LaunchStats"
for spec in "gemm.kg sm_90a 4096 4096 4092 narrow" "gemm_b_row.kg sm_90a 4096 4096 4092 narrow" \
            "gemm.kg sm_80 4096 4096 4092 narrow" "gemm.kg sm_90a 4096 4096 4096 gemm"; do
  set -- $spec
  tag="${1%.kg}_$2_$5"
  echo "== $tag"
  timeout 150 ncu --clock-control none -k "regex:$6" --launch-count 1 $sections \
    python3 -m kgen run "examples/$1" --arch "$2" --size "M=$3,N=$4,K=$5" --no-check --no-tuned \
    > "$out/ncu_$tag.txt" 2>&1
  echo "rc $?"
  grep -E "Duration|Throughput|Stall|Issued|Eligible|Warp Cycles" "$out/ncu_$tag.txt" | head -40
done
