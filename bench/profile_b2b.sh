#!/usr/bin/env bash
# Nsight Compute profile of the back-to-back register example at CUTLASS example 13's shapes.
# Run on the GPU machine: bash .gpu/device-run.sh bash bench/profile_b2b.sh [EXAMPLE]
set -u
ex=${1:-examples/b2b_gemm_rf.kg}
name=$(basename "$ex" .kg)
out=${OUT:-/tmp}
ncu --clock-control none --set full -k "regex:${name}" --launch-skip 3 --launch-count 1 \
    python3 -m kgen run "$ex" --size M=81920 --no-check --bench --iters 5 \
    > "$out/ncu_${name}.txt" 2>&1
echo "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Stall|Issue Slots|Eligible|L2 Hit|Block Limit" "$out/ncu_${name}.txt" | head -60
