#!/usr/bin/env bash
# One visit: the staged C issued halfway through the mainloop (GemmSchedule.staged_input_late),
# checked under compute-sanitizer on ragged sizes, then bench/staged_late.py. Run:
# bash .gpu/device-run.sh bash bench/staged_late_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
cat > /tmp/late_check.py <<'PY'
import dataclasses, sys
sys.path.insert(0, "bench")
from staged_late import late
from kgen import ir
from kgen.emit import emit
from kgen.harness.run import run
from kgen.lower import lower
from kgen.parse import parse_file
kernel = dataclasses.replace(parse_file("examples/gemm_bias_relu.kg").kernels[0], target=ir.Arch.SM90A)
plan = late(lower(kernel))
source = emit(plan, source_name="late.kg", source_hash="", command="late")
for mnk in [(296, 520, 136), (1000, 1000, 64), (129, 264, 1000), (256, 256, 0)]:
    report = run(kernel, plan, source, dict(zip("MNK", mnk)), check=True)
    print(mnk, "PASS" if report.ok else "FAIL")
PY
echo "== the late staged C on ragged sizes, then under compute-sanitizer"
timeout 120 python3 /tmp/late_check.py 2>&1 | tail -5 | tee "$OUT/late_check.log"
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 /tmp/late_check.py >/tmp/san.log 2>&1
  rc=$?  # before any command substitution in the echo resets $?
  echo "late C $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASS|FAIL' /tmp/san.log | tail -5 | tr '\n' ' ')"
done 2>&1 | tee "$OUT/sanitizers_late.log"
echo "== bench/staged_late.py"
timeout 300 python3 bench/staged_late.py --json "$OUT/staged_late.json" 2>&1 | grep -v Warning \
  | tee "$OUT/staged_late.log"
