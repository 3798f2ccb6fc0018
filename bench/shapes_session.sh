#!/usr/bin/env bash
# One visit for issue 16 (any M, N, K: the narrow entry point): its GPU tests on both targets,
# the Hopper and sentinel tests and the rest of `pytest -m gpu` (no regression),
# compute-sanitizer on the narrow kernels, the .cu's own launcher at odd sizes, then
# bench/any_shape.py. Run
#   bash .gpu/device-run.sh bash bench/shapes_session.sh
# SKIP_PYTEST / SKIP_REST / SKIP_SAN / SKIP_LAUNCHER / NO_BENCH leave a part out. Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

if [ -z "${SKIP_PYTEST:-}" ]; then
  echo "== pytest: any shape, both targets"
  timeout 420 python3 -m pytest tests/gpu/test_any_shape_gpu.py -m gpu -q -x -p no:cacheprovider 2>&1 \
    | tail -25 | tee "$OUT/pytest_shapes.log"
fi
if [ -z "${SKIP_REST:-}" ]; then
  echo "== pytest -m gpu (the rest)"
  timeout 540 python3 -m pytest -m gpu -q -p no:cacheprovider --deselect tests/gpu/test_any_shape_gpu.py \
    2>&1 | tail -12 | tee "$OUT/pytest_gpu.log"
fi

if [ -z "${SKIP_SAN:-}" ]; then
  echo "== compute-sanitizer (memcheck, racecheck, synccheck) on the narrow entry points"
  for run in "examples/gemm_bias_relu.kg sm_90a M=1000,N=1001,K=100" "examples/gemm_bias_relu.kg sm_80 M=1000,N=1001,K=100" \
             "examples/evt_colsum.kg sm_90a M=300,N=129,K=9" "examples/evt_multi_output.kg sm_90a M=77,N=300,K=31" \
             "bench/kernels/gemm_pingpong_sm90a.kg sm_90a M=1000,N=263,K=201"; do
    set -- $run
    for tool in memcheck racecheck synccheck; do
      log="$OUT/san.log.tmp"
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$1" --arch "$2" --size "$3" --iters 1 >"$log" 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$(basename "$1") $2 $3 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ok|FAIL' "$log" | tail -2 | tr '\n' ' ')"
    done
  done | tee "$OUT/sanitizers.log"
  rm -f "$OUT/san.log.tmp"
fi

if [ -z "${SKIP_LAUNCHER:-}" ]; then
  echo "== the .cu's own C++ launcher at odd sizes (sm_90a and sm_80 code), built with nvcc"
  timeout 300 bash bench/smoke/gemm_launcher.sh 2>&1 | tail -24 | tee "$OUT/launcher.log"
fi

if [ -z "${NO_BENCH:-}" ]; then
  echo "== bench/any_shape.py"
  timeout 500 python3 bench/any_shape.py --json "$OUT/any_shape.json" 2>&1 | grep -v Warning | tee "$OUT/any_shape.log"
fi
