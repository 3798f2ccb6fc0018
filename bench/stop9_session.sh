#!/usr/bin/env bash
# The ninth stop's GPU visits for issue 17, on the GPU machine through .gpu/device-run.sh
# (carry .whl and .gpu). Logs land in $OUT (bench/logs/stop9/ once fetched). STEP=
#   a  the whole `pytest -m gpu` (bench/gpu_tests.sh), then compute-sanitizer on chains whose
#      last N overhangs the tile (N1 = 96, 160, 224, with a bias1[col] epilogue) at M = 17, 1000
. "$(dirname "$0")/session_head.sh"
case ${STEP:-a} in
a)
  bash bench/gpu_tests.sh
  python3 - <<'PY'
from tests.kernels import B2B_CHAIN
for t, k0, n0, n1 in (("f16", 256, 64, 96), ("bf16", 256, 128, 160), ("bf16", 256, 64, 224)):
    text = B2B_CHAIN.format(t=t, k0=k0, n0=n0, n1=n1).replace(
        "  vector bias0", f"  vector bias1 : f32[{n1}]\n  vector bias0").replace(
        "D1 = relu(acc)", "D1 = relu(acc + bias1[col])")
    open(f"/tmp/over_{t}_{k0}_{n0}_{n1}.kg", "w").write(text)
PY
  for kg in /tmp/over_*.kg; do
    for m in 17 1000; do
      for tool in memcheck racecheck synccheck; do
        timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m kgen run $kg \
          --size M=$m > /tmp/san.log 2>&1
        echo "$(basename $kg .kg) M=$m $tool exit=$? $(grep -E '^(PASS|FAIL)' /tmp/san.log | head -1) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1)"
      done
    done
  done | tee "$OUT/sanitizer_overhang.log" ;;
esac
