#!/usr/bin/env bash
# One visit: the epilogue tile (GemmSchedule.stages_d, issue 15). PART=tests: its GPU tests and
# compute-sanitizer; PART=bench: the mainloop's clock reads per ring depth
# (bench/prototypes/stages_clock.py) and bench/epilogue_tile.py. Run:
# PART=... bash .gpu/device-run.sh bash bench/epilogue_tile_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  echo "== GPU tests"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_epilogue_tile_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/pytest_epilogue_tile.log"
  cat > /tmp/tile_check.py <<'PY'
from kgen.api import build
from kgen.harness.run import run
from tests.gpu.test_epilogue_tile_gpu import kernel_of
for label, mnk in [("full", (300, 520, 136)), ("col_out", (129, 260, 200)), ("pingpong", (300, 264, 136)),
                   ("col_c", (300, 520, 200)), ("cluster_c", (300, 520, 136)), ("pingpong_c", (300, 264, 136))]:
    built = build(kernel_of(label))
    report = run(built.kernel, built.plan, built.source, dict(zip("MNK", mnk)), check=True)
    print(label, mnk, "PASS" if report.ok else "FAIL")
PY
  echo "== compute-sanitizer"
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 /tmp/tile_check.py >/tmp/san.log 2>&1
    rc=$?
    echo "$tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASS|FAIL' /tmp/san.log | tail -5 | tr '\n' ' ')"
  done 2>&1 | tee "$OUT/sanitizers.log"
fi
if [ "$PART" = c ]; then  # C's boxes staged in the epilogue tile, against the whole tile's C
  timeout 200 python3 bench/epilogue_tile.py --kernels "C epilogue" --rounds 3 \
    --sizes 4096,4096,4096 8192,8192,8192 6144,5120,3072 --json "$OUT/epilogue_tile_c.json" 2>&1 \
    | grep -v Warning | tee "$OUT/epilogue_tile_c.log"
fi
if [ "$PART" = all ] || [ "$PART" = bench ]; then
  echo "== clock reads per ring depth"
  timeout 250 python3 bench/prototypes/stages_clock.py --variants "128x256 s3" "128x256 s4" "128x192 s4" \
    --sizes 4096,4096,4096 8192,8192,8192 6144,5120,3072 2>&1 | grep -v Warning | tee "$OUT/stages_clock.log"
  echo "== bench/epilogue_tile.py"
  timeout 300 python3 bench/epilogue_tile.py --rounds 3 --sizes 4096,4096,4096 8192,8192,8192 \
    --json "$OUT/epilogue_tile.json" 2>&1 | grep -v Warning | tee "$OUT/epilogue_tile.log"
fi
