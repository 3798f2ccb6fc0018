#!/usr/bin/env bash
# One visit for issue 15 (the warp-specialized sm_90a GEMM): its GPU tests, the sentinel test
# on sm_90a, the rest of `pytest -m gpu`, compute-sanitizer on the new kernels, the .cu's own
# launcher built with nvcc, then bench/hopper_gemm.py and the B2B benchmark. Run
#   bash .gpu/device-run.sh bash bench/hopper_session.sh
# SKIP_PYTEST / SKIP_REST / SKIP_SAN / SKIP_LAUNCHER / NO_BENCH leave a part out; QUICK=1 runs
# the benchmark's first shape only. Logs go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

if [ -z "${SKIP_PYTEST:-}" ]; then
  echo "== pytest: the Hopper GEMM and the sentinel test on sm_90a"
  timeout 300 python3 -m pytest tests/gpu/test_hopper_gpu.py -m gpu -q -p no:cacheprovider 2>&1 \
    | tail -25 | tee "$OUT/pytest_hopper.log"
  timeout 200 python3 -m pytest tests/gpu/test_sentinel.py -k sm_90a -m gpu -q -p no:cacheprovider 2>&1 \
    | tail -8 | tee -a "$OUT/pytest_hopper.log"
fi
if [ -z "${SKIP_REST:-}" ]; then
  echo "== pytest -m gpu (the rest)"
  timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider --deselect tests/gpu/test_hopper_gpu.py \
    2>&1 | tail -8 | tee "$OUT/pytest_gpu.log"
fi

if [ -z "${SKIP_SAN:-}" ]; then
  echo "== compute-sanitizer (memcheck, racecheck, synccheck) on the Hopper kernels"
  for run in "examples/gemm_bias_relu.kg M=1000,N=1000,K=136" "examples/evt_colsum.kg M=1000,N=520,K=72" \
             "examples/evt_softmax_stats.kg M=300,N=1000,K=40" "bench/kernels/gemm_pingpong_sm90a.kg M=1000,N=264,K=200" \
             "examples/b2b_gemm_rf_pingpong_sm90a.kg M=1000"; do
    set -- $run
    for tool in memcheck racecheck synccheck; do
      log="$OUT/san.log.tmp"
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$1" --arch sm_90a --size "$2" --iters 1 >"$log" 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$(basename "$1") $2 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ok|FAIL' "$log" | tail -2 | tr '\n' ' ')"
    done
  done | tee "$OUT/sanitizers.log"
  rm -f "$OUT/san.log.tmp"
fi

if [ -z "${SKIP_LAUNCHER:-}" ]; then
  echo "== the .cu's own C++ launcher (tensor maps of A, B, D from the driver), built with nvcc"
  timeout 200 bash bench/smoke/gemm_launcher.sh 2>&1 | tail -6 | tee "$OUT/launcher.log"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gemm_launcher 1000 520 72 2>&1 | tail -3 | tee -a "$OUT/launcher.log"
  timeout 200 bash bench/smoke/pingpong_launcher.sh 2>&1 | tail -4 | tee -a "$OUT/launcher.log"
fi

if [ -z "${NO_BENCH:-}" ]; then
  echo "== bench/hopper_gemm.py"
  timeout 500 python3 bench/hopper_gemm.py ${QUICK:+--quick} --json "$OUT/hopper_gemm.json" 2>&1 | grep -v Warning | tee "$OUT/hopper_gemm.log"
  echo "== B2B benchmark"
  timeout 240 python3 bench/b2b_bench.py 2>&1 | grep -v Warning | tail -22 | tee "$OUT/b2b_bench.log"
fi
