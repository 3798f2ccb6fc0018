#!/usr/bin/env bash
# One visit: the epilogue in groups (GemmSchedule.epilogue_groups) and the tile copied out of the
# staging (issue 15: NVRTC's time). PART=tests: the GPU tests of both, the suites whose epilogues
# changed, and compute-sanitizer on grouped kernels with a copied-out last tile. PART=bench:
# bench/epilogue_groups.py (grouped against unrolled: NVRTC on this CPU, time against the
# unfused PyTorch), the B2B example, and the fast-entry compile times of the five examples.
# Run: PART=... bash .gpu/device-run.sh bash bench/epilogue_groups_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
cat > /tmp/groups_check.py <<'PY'
import sys
from tests.gpu import test_epilogue_groups_gpu as t
for label in sys.argv[1:] or ["c_epilogue_tile", "c_whole_tile", "col_c", "pingpong"]:
    t.test_a_padded_last_tile_is_copied_out_of_the_staging(label, 4)
    t._check(t.built_in(t.kernel_of(label), t.VARIANTS[label][5]), (300, 520, 136),
             "pingpong" if label == "pingpong" else "cooperative")
print("PASS")
PY
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  echo "== GPU tests"
  timeout ${TESTS_S:-400} python3 -m pytest -q -m gpu -p no:cacheprovider ${SUITES:-tests/gpu/test_epilogue_groups_gpu.py \
    tests/gpu/test_epilogue_tile_gpu.py tests/gpu/test_staged_input_gpu.py tests/gpu/test_col_output_gpu.py \
    tests/gpu/test_staged_vectors_gpu.py} 2>&1 | tail -15 | tee "$OUT/pytest_${TAG:-groups}.log"
fi
if [ "$PART" = sanitize ]; then
  # --report-api-errors no: cuda-bindings' driver loader probes cuGetProcAddress on the host
  for tool in memcheck racecheck synccheck; do
    PYTHONPATH=$PWD:$PYTHONPATH timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
      --report-api-errors no python3 /tmp/groups_check.py >/tmp/san.log 2>&1
    echo "$tool exit $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASS|Error' /tmp/san.log | tail -5 | tr '\n' ' ')"
  done 2>&1 | tee "$OUT/sanitizers.log"
fi
if [ "$PART" = all ] || [ "$PART" = bench ]; then
  echo "== grouped against unrolled"
  timeout 420 python3 bench/epilogue_groups.py --rounds ${ROUNDS:-3} --json "$OUT/epilogue_groups.json" 2>&1 \
    | grep -v Warning | tee "$OUT/epilogue_groups.log"
  echo "== the B2B example"
  timeout 120 python3 bench/b2b_bench.py 2>&1 | grep -v -i warn | tail -20 | tee "$OUT/b2b_example.log"
  echo "== NVRTC, the fast entry point alone, each example for sm_90a (fastest of 3, empty caches)"
  python3 bench/compile_times.py 2>&1 | tee "$OUT/compile_times.log"
fi
