#!/usr/bin/env bash
# One visit for the back-to-back examples (issue 5): GPU tests, the three sanitizers on the
# register examples (several tiles per CTA, so the A ring runs across tiles), and the benchmark
# with and without the stream hold. Run there as
#   bash .gpu/device-run.sh bash bench/b2b_session.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache

echo "== pytest -m gpu"
python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -6 | tee "$OUT/pytest_gpu.log"

echo "== compute-sanitizer"
for ex in examples/b2b_gemm_rf.kg examples/b2b_gemm_rf_bf16.kg examples/b2b_gemm_rf_sm90a.kg examples/b2b_gemm_rf_bf16_sm90a.kg; do
  for tool in memcheck racecheck synccheck; do
    for m in 1000 40000; do
      log="$OUT/san_$(basename "$ex" .kg)_${tool}_$m.log"
      compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$ex" --size M=$m --iters 1 >"$log" 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$(basename "$ex") $tool M=$m exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
    done
  done
done | tee "$OUT/sanitizers.log"
# the resident chain whose tiles overhang N (column checks in the 16-byte stores)
compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_b2b_gpu.py -k overhanging >"$OUT/san_overhang.log" 2>&1
rc=$?  # before any command substitution in the echo resets $?
echo "overhang memcheck exit $rc : $(grep -E 'ERROR SUMMARY' "$OUT/san_overhang.log" | tail -1)" | tee -a "$OUT/sanitizers.log"

echo "== b2b benchmark (stream held while enqueuing)"
python3 bench/b2b_bench.py --json "$OUT/b2b_bench_hold.json" 2>&1 | grep -v Warning | tee "$OUT/b2b_bench_hold.log"
echo "== b2b benchmark (no hold: host launch gaps included, the method of the earlier runs)"
python3 bench/b2b_bench.py --no-hold --json "$OUT/b2b_bench_nohold.json" 2>&1 | grep -v Warning | tee "$OUT/b2b_bench_nohold.log"
