#!/usr/bin/env bash
# One visit: the sm_90a staging epilogue's cost (issue 15's C target). The clock reads of
# bench/prototypes/epilogue_clock.py, bench/epilogue_cost.py, the GPU tests of the one-gemm
# Hopper kernels, and compute-sanitizer on ragged sizes. Run:
# bash .gpu/device-run.sh bash bench/epilogue_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
if [ "$PART" = all ] || [ "$PART" = bench ]; then
  echo "== clock reads"
  timeout 200 python3 bench/prototypes/epilogue_clock.py --sizes 4096,4096,4096 8192,8192,8192 2>&1 \
    | grep -v Warning | tee "$OUT/epilogue_clock.log"
  echo "== bench/epilogue_cost.py"
  timeout 300 python3 bench/epilogue_cost.py --rounds 3 --sizes 4096,4096,4096 6144,6144,4096 8192,8192,8192 \
    --json "$OUT/epilogue_cost.json" 2>&1 | grep -v Warning | tee "$OUT/epilogue_cost.log"
fi
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  cat > /tmp/epi_check.py <<'PY'
import dataclasses, sys
from kgen import ir
from kgen.emit import emit
from kgen.harness.run import run
from kgen.lower import lower
from kgen.parse import parse_file
for path in ["examples/gemm_bias_relu.kg", "examples/gemm_gelu_rowscale.kg", "examples/gemm.kg"]:
    kernel = dataclasses.replace(parse_file(path).kernels[0], target=ir.Arch.SM90A)
    plan = lower(kernel)
    source = emit(plan, source_name="x.kg", source_hash="", command="x")
    for mnk in [(296, 520, 136), (1000, 1000, 64), (129, 264, 1000), (77, 136, 72)]:
        report = run(kernel, plan, source, dict(zip("MNK", mnk)), check=True)
        print(path, mnk, "PASS" if report.ok else "FAIL")
PY
  echo "== ragged sizes, then compute-sanitizer"
  timeout 200 python3 /tmp/epi_check.py 2>&1 | grep -v Warning | tail -12 | tee "$OUT/epi_check.log"
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 /tmp/epi_check.py >/tmp/san.log 2>&1
    rc=$?
    echo "$tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAIL' /tmp/san.log | tail -3 | tr '\n' ' ')"
  done 2>&1 | tee "$OUT/sanitizers.log"
  echo "== GPU tests"
  timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_hopper_gpu.py \
    tests/gpu/test_staged_input_gpu.py tests/gpu/test_staged_vectors_gpu.py tests/gpu/test_mn_major_gpu.py \
    tests/gpu/test_col_output_gpu.py tests/gpu/test_batches_gpu.py tests/gpu/test_evt_gpu.py 2>&1 | tail -15 \
    | tee "$OUT/pytest_gpu.log"
fi
