#!/usr/bin/env bash
# One visit for issue 15's C through the copy engine (ReuseSmemC): its GPU tests and the Hopper
# GEMM's, compute-sanitizer on both schedules with C staged, the .cu's own launcher (now also
# encoding C's map), then bench/hopper_gemm.py (QUICK=1: the bare GEMM at 4096^3 only).
# Run: bash .gpu/device-run.sh bash bench/staged_session.sh. Logs go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
echo "== pytest: C staged, and the Hopper GEMM"
timeout 240 python3 -m pytest tests/gpu/test_staged_input_gpu.py tests/gpu/test_hopper_gpu.py -m gpu -q \
  -p no:cacheprovider 2>&1 | tail -12 | tee "$OUT/pytest_staged.log"
echo "== compute-sanitizer (memcheck, racecheck, synccheck)"
for run in "examples/gemm_bias_relu.kg M=1000,N=1000,K=136" \
           "bench/kernels/gemm_c_pingpong_sm90a.kg M=1000,N=264,K=200"; do
  set -- $run
  for tool in memcheck racecheck synccheck; do
    log="$OUT/san.log.tmp"
    timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 -m kgen run "$1" --arch sm_90a --size "$2" --iters 1 >"$log" 2>&1
    rc=$?  # before any command substitution in the echo resets $?
    echo "$(basename "$1") $2 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ok|FAIL' "$log" | tail -2 | tr '\n' ' ')"
  done
done | tee "$OUT/sanitizers.log"
rm -f "$OUT/san.log.tmp"
echo "== the .cu's own launcher"
timeout 150 bash bench/smoke/gemm_launcher.sh 2>&1 | tail -6 | tee "$OUT/launcher.log"
echo "== bench/hopper_gemm.py"
timeout 420 python3 bench/hopper_gemm.py ${QUICK:+--quick} --json "$OUT/hopper_gemm.json" 2>&1 \
  | grep -v Warning | tee "$OUT/hopper_gemm.log"
