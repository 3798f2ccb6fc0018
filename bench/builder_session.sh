#!/usr/bin/env bash
# One visit for issue 17's builder: its GPU tests, then parts of bench/defaults.py. Run
#   bash .gpu/device-run.sh bash bench/builder_session.sh
# PARTS="1 3" picks the bench parts (default: 2; PARTS=none for no part); SKIP_PYTEST=1 leaves
# the tests out; B2B=1 adds the chain GPU tests, the B2B benchmark and compute-sanitizer on the
# ping-pong chains (the producer warpgroup's setmaxnreg).
# Logs go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
if [ -z "${SKIP_PYTEST:-}" ]; then
  echo "== pytest: the builder's choices"
  timeout 300 python3 -m pytest tests/gpu/test_builder_gpu.py -m gpu -q -p no:cacheprovider 2>&1 \
    | tail -25 | tee "$OUT/pytest_builder.log"
fi
if [ -n "${B2B:-}" ]; then
  echo "== pytest: the chains"
  timeout 300 python3 -m pytest tests/gpu/test_b2b_gpu.py -m gpu -q -p no:cacheprovider 2>&1 \
    | tail -6 | tee "$OUT/pytest_b2b.log"
  echo "== compute-sanitizer on the ping-pong chains"
  for run in "examples/b2b_gemm_rf_pingpong_sm90a.kg M=1000" "examples/b2b_gemm_rf_pingpong_bf16_sm90a.kg M=8193"; do
    set -- $run
    for tool in memcheck racecheck synccheck; do
      log="$OUT/san.log.tmp"
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$1" --size "$2" --iters 1 >"$log" 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$(basename "$1") $2 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ok|FAIL' "$log" | tail -2 | tr '\n' ' ')"
    done
  done | tee "$OUT/sanitizers.log"
  rm -f "$OUT/san.log.tmp"
  echo "== bench/b2b_bench.py"
  timeout 200 python3 bench/b2b_bench.py --json "$OUT/b2b_bench.json" 2>&1 | tee "$OUT/b2b_bench.log"
fi
PARTS=${PARTS:-2}
[ "$PARTS" = none ] && exit 0
tag=$(echo $PARTS | tr ' ' '_')
echo "== bench/defaults.py --part $PARTS"
timeout 480 python3 bench/defaults.py --part $PARTS --json "$OUT/defaults_$tag.json" 2>&1 \
  | tee "$OUT/defaults_$tag.log"
