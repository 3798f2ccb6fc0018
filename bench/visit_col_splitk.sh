#!/usr/bin/env bash
# One visit: column-major outputs through the copy engine (tests, sanitizers, bench/col_output.py),
# split-K with epilogue reductions (bench/splitk_red_session.sh) and zero sizes through kgen run.
# PART=tests | bench. Run: bash .gpu/device-run.sh bash bench/visit_col_splitk.sh. Logs in $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
case ${PART:-tests} in
tests)
  echo "== pytest: column-major outputs"
  timeout 200 python3 -m pytest tests/gpu/test_col_output_gpu.py -m gpu -q -p no:cacheprovider \
    2>&1 | tail -20 | tee "$OUT/pytest_col.log"
  echo "== compute-sanitizer: a column-major output with a column-major C staged"
  python3 - <<'PY'
import sys; sys.path.insert(0, ".")
from bench.col_output import kernel_text
open("/tmp/col_c.kg", "w").write(kernel_text("bf16", "col", True))
PY
  for tool in memcheck racecheck synccheck; do
    timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 -m kgen run /tmp/col_c.kg --size M=296,N=520,K=136 --iters 1 >/tmp/san.log 2>&1
    rc=$?  # before any command substitution in the echo resets $?
    echo "col_c 296x520x136 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
  done 2>&1 | tee "$OUT/sanitizers_col.log"
  echo "== zero sizes through kgen run"
  for run in "examples/gemm_bias_relu.kg sm_90a M=0,N=1000,K=100" "examples/gemm_bias_relu.kg sm_90a M=1000,N=1000,K=0" \
             "examples/evt_colsum.kg sm_90a M=0,N=264,K=72" "examples/evt_colsum.kg sm_80 M=0,N=264,K=72" \
             "examples/evt_softmax_stats.kg sm_90a M=300,N=0,K=72" "examples/splitk_gelu.kg sm_80 M=64,N=64,K=0" \
             "examples/batched_reductions.kg sm_90a M=64,N=64,K=64,L=0" "examples/b2b_gemm_rf_sm90a.kg sm_90a M=0"; do
    set -- $run
    timeout 60 python3 -m kgen run "$1" --arch "$2" --size "$3" --iters 1 >/tmp/zero.log 2>&1
    rc=$?  # before any command substitution in the echo resets $?
    echo "$(basename "$1") $2 $3 exit $rc : $(tail -3 /tmp/zero.log | tr '\n' ' ' | cut -c1-300)"
  done 2>&1 | tee "$OUT/zero_sizes.log"
  echo "== split-K with reductions"
  OUT=$OUT bash bench/splitk_red_session.sh ;;
bench)
  echo "== the cluster cases of the column-major tests, after the fix"
  timeout 100 python3 -m pytest tests/gpu/test_col_output_gpu.py -m gpu -q -p no:cacheprovider \
    -k "cluster or bare_column_major_output and cooperative" 2>&1 | tail -4 | tee "$OUT/pytest_col_rerun.log"
  echo "== zero sizes through kgen run, after the fix"
  for run in "examples/gemm_bias_relu.kg sm_90a M=0,N=1000,K=100" "examples/evt_colsum.kg sm_90a M=0,N=264,K=72" \
             "examples/evt_colsum.kg sm_80 M=0,N=264,K=72" "examples/evt_softmax_stats.kg sm_90a M=300,N=0,K=72" \
             "examples/batched_reductions.kg sm_90a M=64,N=64,K=64,L=0" "examples/b2b_gemm_rf_sm90a.kg sm_90a M=0"; do
    set -- $run
    timeout 60 python3 -m kgen run "$1" --arch "$2" --size "$3" --iters 1 >/tmp/zero.log 2>&1
    rc=$?
    echo "$(basename "$1") $2 $3 exit $rc : $(tail -3 /tmp/zero.log | tr '\n' ' ' | cut -c1-300)"
  done 2>&1 | tee "$OUT/zero_sizes_rerun.log"
  echo "== pictures: kgen tune --plot, kgen run --bench --plot"
  timeout 120 python3 -m kgen tune examples/gemm.kg --arch sm_90a --size M=4096,N=4096,K=4096 \
    --limit 12 --no-cache --plot "$OUT/tune_gemm.png" 2>&1 | tail -18 | tee "$OUT/tune_plot.log"
  timeout 90 python3 -m kgen run examples/gemm_bias_relu.kg --arch sm_90a --size M=8192,N=8192,K=8192 \
    --bench --plot "$OUT/roofline_gemm_bias_relu.png" 2>&1 | tail -12 | tee "$OUT/run_plot.log"
  echo "== bench/col_output.py"
  timeout 300 python3 bench/col_output.py --json "$OUT/col_output.json" 2>&1 | grep -v Warning \
    | tee "$OUT/col_output.log" ;;
esac
