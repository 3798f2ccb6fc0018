#!/usr/bin/env bash
# One visit for the redesign (issue 14): GPU tests, sanitizers on a sample, the GEMM examples'
# benchmarks and the ping-pong B2B benchmark, so a refactor can be shown not to regress. Run
#   bash .gpu/device-run.sh bash bench/redesign_session.sh
# PYTEST=<args> narrows the tests (default: -m gpu), SKIP_PYTEST / SKIP_SAN / NO_BENCH leave a
# part out. Logs go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

if [ -z "${SKIP_PYTEST:-}" ]; then
  echo "== pytest ${PYTEST:--m gpu}"
  timeout 420 python3 -m pytest ${PYTEST:--m gpu} -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/pytest_gpu.log"
fi

if [ -z "${SKIP_SAN:-}" ]; then
  echo "== compute-sanitizer (memcheck, racecheck, synccheck) on a sample"
  for run in "examples/gemm_bias_relu.kg M=1000,N=1000,K=40" "examples/evt_colsum.kg M=1000,N=520,K=72" \
             "examples/b2b_gemm_rf_pingpong_sm90a.kg M=1000" "examples/b2b_gemm_rf_sm90a.kg M=1000"; do
    set -- $run
    for tool in memcheck racecheck synccheck; do
      log="$OUT/san.log.tmp"
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$1" --size "$2" --iters 1 >"$log" 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$(basename "$1") $2 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
    done
  done | tee "$OUT/sanitizers.log"
  rm -f "$OUT/san.log.tmp"
fi

if [ -z "${SKIP_LAUNCHER:-}" ]; then
  echo "== the .cu's own C++ launchers, built with nvcc (ping-pong: tensor map from the driver)"
  timeout 200 bash bench/smoke/pingpong_launcher.sh 2>&1 | tail -6 | tee "$OUT/launcher.log"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/pingpong_launcher 1000 2>&1 | tail -3 | tee -a "$OUT/launcher.log"
  if command -v cmake >/dev/null; then
    timeout 300 bash examples/cpp_consumer/run_on_gpu.sh 2>&1 | tail -8 | tee -a "$OUT/launcher.log"
  else
    echo "no cmake here: examples/cpp_consumer not built" | tee -a "$OUT/launcher.log"
  fi
fi

if [ -z "${NO_BENCH:-}" ]; then
  echo "== GEMM examples (kgen run --bench: kgen and PyTorch in one process)"
  for run in "gemm M=4096,N=4096,K=4096" "gemm M=8192,N=8192,K=8192" \
             "gemm_bias_relu M=8192,N=8192,K=8192" "gemm_gelu_rowscale M=8192,N=8192,K=8192" \
             "evt_multi_output M=8192,N=8192,K=8192" "evt_softmax_stats M=8192,N=8192,K=8192"; do
    set -- $run
    timeout 120 python3 -m kgen run "examples/$1.kg" --size "$2" --bench --json >"$OUT/one.json" 2>>"$OUT/bench.err"
    cat "$OUT/one.json" >>"$OUT/bench_gemm.jsonl"; echo >>"$OUT/bench_gemm.jsonl"
    python3 - "$OUT/one.json" "$1 $2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as err:
    print(sys.argv[2], "no report:", err); sys.exit()
print("%-22s %s ok=%s kgen %.4f ms %.0f TFLOP/s | torch %.4f ms | %.2fx" % (
    r["kernel"], sys.argv[2].split()[1], r["ok"], r["time_ms"], r["tflops"],
    r.get("torch_time_ms") or 0, r.get("speedup_vs_torch") or 0))
PY
  done | tee "$OUT/bench_gemm.log"
  rm -f "$OUT/one.json"
  echo "== B2B benchmark"
  timeout 240 python3 bench/b2b_bench.py --json "$OUT/b2b_bench.json" 2>&1 | grep -v Warning | tail -25 | tee "$OUT/b2b_bench.log"
fi
