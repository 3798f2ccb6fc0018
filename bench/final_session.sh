#!/usr/bin/env bash
# The closing visits of this session (issues 16 and 17 merged): one of
#   STEP=tests  the new GPU tests: kgen tune, batches, the builder's choices, kgen run
#   STEP=tune   bench/tune_bench.py (hand, builder and tuned schedules; the tune's wall time)
#   STEP=rest   the rest of pytest -m gpu, bench/batched.py, compute-sanitizer on batched kernels
# Run: STEP=tests bash .gpu/device-run.sh bash bench/final_session.sh. Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
case "${STEP:-tests}" in
tests)
  for f in test_tune_gpu test_batches_gpu test_builder_gpu test_run_gpu; do
    echo "== pytest tests/gpu/$f.py"
    timeout 280 python3 -m pytest tests/gpu/$f.py -m gpu -q -p no:cacheprovider -x 2>&1 \
      | tail -12 | tee "$OUT/pytest_$f.log"
  done ;;
tune)
  timeout 280 python3 bench/tune_bench.py --example gemm --example gemm_bias_relu \
    --size M=4096,N=4096,K=4096 --json "$OUT/tune_4096.json" 2>&1 | tee "$OUT/tune_4096.log"
  timeout 280 python3 bench/tune_bench.py --example gemm --size M=8192,N=8192,K=512 \
    --size M=512,N=512,K=8192 --json "$OUT/tune_small.json" 2>&1 | tee "$OUT/tune_small.log" ;;
rest)
  echo "== pytest -m gpu (the rest)"
  timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider \
    --deselect tests/gpu/test_tune_gpu.py --deselect tests/gpu/test_batches_gpu.py \
    --deselect tests/gpu/test_builder_gpu.py --deselect tests/gpu/test_run_gpu.py \
    2>&1 | tail -8 | tee "$OUT/pytest_rest.log"
  echo "== bench/batched.py"
  timeout 120 python3 bench/batched.py --json "$OUT/batched.json" 2>&1 | tee "$OUT/batched.log" ;;
esac
# STEP=sweep: the bare GEMM sweep after kgen tune at each shape (f16)
if [ "${STEP:-}" = sweep ]; then
  timeout 560 python3 bench/defaults.py --part 3 --tuned --dtype f16 --json "$OUT/sweep_tuned.json" \
    2>&1 | tee "$OUT/sweep_tuned.log"
fi
# STEP=batches: the batched GPU tests, compute-sanitizer on the batched examples, bench/batched.py
if [ "${STEP:-}" = batches ]; then
  timeout 330 python3 -m pytest tests/gpu/test_batches_gpu.py -m gpu -q -p no:cacheprovider 2>&1 \
    | tail -15 | tee "$OUT/pytest_batches.log"
  for run in "examples/batched_gemm_bias.kg L=3,M=300,N=264,K=72" "examples/batched_reductions.kg L=3,M=200,N=130,K=40"; do
    set -- $run
    for arch in sm_90a sm_80; do
      for tool in memcheck racecheck synccheck; do
        log="$OUT/san.log.tmp"
        timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 -m kgen run "$1" --arch $arch --size "$2" --iters 1 >"$log" 2>&1
        rc=$?  # before any command substitution in the echo resets $?
        echo "$(basename "$1") $arch $2 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
      done
    done
  done | tee "$OUT/sanitizers_batches.log"
  rm -f "$OUT/san.log.tmp"
  timeout 150 python3 bench/batched.py --json "$OUT/batched.json" 2>&1 | tee "$OUT/batched.log"
fi
