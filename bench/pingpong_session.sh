#!/usr/bin/env bash
# One visit for `schedule pingpong` (issue 5): its GPU tests, the three sanitizers on the two
# ping-pong examples (several tiles per warpgroup, so the ring wraps many times), and the b2b
# benchmark. Run there as
#   bash .gpu/device-run.sh bash bench/pingpong_session.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache

if [ -z "${SKIP_PYTEST:-}" ]; then
echo "== pytest -m gpu (${PYTEST_K:-all})"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -3 | tee "$OUT/pytest_gpu.log"
fi

if [ -z "${SKIP_SAN:-}" ]; then
echo "== compute-sanitizer"
# SAN_EXAMPLES, SAN_TOOLS and SAN_SIZES choose the sanitizer runs; SKIP_PYTEST, SKIP_SAN and
# NO_BENCH leave a part out
for ex in ${SAN_EXAMPLES:-examples/b2b_gemm_rf_pingpong_sm90a.kg examples/b2b_gemm_rf_pingpong_bf16_sm90a.kg}; do
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    for m in ${SAN_SIZES:-1000 40000}; do
      log="$OUT/san_$(basename "$ex" .kg)_${tool}_$m.log"
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$ex" --size M=$m --iters 1 >"$log" 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$(basename "$ex") $tool M=$m exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
      rm -f "$log"
    done
  done
done | tee "$OUT/sanitizers.log"
fi

if [ -z "${NO_BENCH:-}" ]; then
  echo "== b2b benchmark (stream held while enqueuing)"
  timeout 200 python3 bench/b2b_bench.py --json "$OUT/b2b_bench_hold.json" 2>&1 | grep -v Warning | tee "$OUT/b2b_bench_hold.log"
fi
