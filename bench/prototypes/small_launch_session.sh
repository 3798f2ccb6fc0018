#!/usr/bin/env bash
# The sweep's small launches (issue 17): which kernels cuBLAS runs at the sweep's shapes (this
# GPU), bench/prototypes/small_launch_probe.py (CUDA events, then the kernels alone through
# torch.profiler), then ncu's launch statistics and times of one launch of each variant and of
# torch.matmul at 1024^3 and 128x4096x4096.
# Run: bash .gpu/device-run.sh bash bench/prototypes/small_launch_session.sh
. "$(dirname "$0")/../session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
timeout 60 python3 bench/prototypes/cublas_kernels.py 2>&1 | grep -v -i warn | tee "$OUT/cublas.log"
timeout 300 python3 bench/prototypes/small_launch_probe.py --part ${PARTS:-events profile} 2>&1 \
  | grep -v -i warn | tee "$OUT/small_launch.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 200 "$NCU" --clock-control none --kernel-name regex:'^bare$|nvjet' --nvtx \
  --section LaunchStats --metrics gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes_read.sum \
  python3 bench/prototypes/small_launch_probe.py --part ncu > "$OUT/ncu_small.log" 2>&1
echo "ncu exit $?"; grep -E "bare|nvjet|duration|Cluster|Grid Size|lts__t_bytes|dram__bytes" "$OUT/ncu_small.log" | head -150
