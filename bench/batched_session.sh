#!/usr/bin/env bash
# A visit for the batched kernels' distance from torch.bmm: bench/prototypes/batched_probe.py
# (Schedule values, per-batch and broadcast B, bmm's kernel names), then Nsight Compute's
# speed-of-light and memory sections of bmm and of kgen's cooperative kernel at one shape.
# Run: bash .gpu/device-run.sh bash bench/batched_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
timeout ${PROBE_TIMEOUT:-360} python3 bench/prototypes/batched_probe.py ${PROBE_ARGS:-} 2>&1 \
  | grep -v Warning | tee "$OUT/batched_probe.log"
IFS=';' read -ra runs <<< "${NCU_RUNS:-64,1024,1024,512,bmm;64,1024,1024,512,coop 128x256 s3}"
for run in "${runs[@]}"; do
  echo "== ncu $run"
  timeout 120 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy -k regex:'gemm|probe|xmma|cutlass' --launch-skip 2 --launch-count 1 \
    python3 bench/prototypes/batched_probe.py --ncu "$run" 2>&1 | grep -v '^==PROF==' \
    | tail -70
done 2>&1 | tee "$OUT/batched_ncu.log"
