#!/usr/bin/env bash
# One visit for the 128x192 tile and split-K on the cooperative kernel (issues 16, 17).
# PART=tests | bench | tuned. Run: bash .gpu/device-run.sh bash bench/wave_split_session.sh.
# Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
case ${PART:-tests} in
tests)
  echo "== pytest: split-K on the cooperative kernel, the 192-column tile, batched split-K"
  timeout 330 python3 -m pytest tests/gpu/test_any_shape_gpu.py tests/gpu/test_batches_gpu.py -m gpu -q \
    -p no:cacheprovider -k "cooperative or 192 or split_k" 2>&1 | tail -25 | tee "$OUT/pytest_split.log"
  echo "== compute-sanitizer: the cooperative split-K, fast and narrow entry points"
  python3 - <<'PY'
import re
text = open("examples/splitk_gelu.kg").read()
text = text.replace("target sm_80", "target sm_90a").replace(
    "tile 64x128x64  warps 2x2  stages 4  split 4", "tile 128x128x64  warps 2x4  stages 5  split 3")
open("/tmp/coop_split.kg", "w").write(text)
PY
  for size in M=200,N=264,K=1000 M=77,N=131,K=1001; do
    for tool in memcheck racecheck synccheck; do
      timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run /tmp/coop_split.kg --size $size --iters 1 >/tmp/san.log 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "coop_split $size $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/sanitizers_split.log"
  echo "== bench/wave_split.py --part gelu"
  timeout 150 python3 bench/wave_split.py --part gelu --json "$OUT/wave_split_gelu.json" 2>&1 \
    | grep -v Warning | tee "$OUT/wave_split_gelu.log" ;;
bench)
  echo "== bench/wave_split.py --part bare"
  timeout 560 python3 bench/wave_split.py --part bare --json "$OUT/wave_split_bare.json" 2>&1 \
    | grep -v Warning | tee "$OUT/wave_split_bare.log" ;;
tuned)
  echo "== bench/defaults.py --part 3 --tuned (f16 sweep, then own shapes)"
  timeout 400 python3 bench/defaults.py --part 3 --tuned --dtype f16 --json "$OUT/sweep_tuned.json" \
    2>&1 | grep -v Warning | tee "$OUT/sweep_tuned.log"
  timeout 180 python3 bench/defaults.py --part 3 --tuned --dtype f16 --shapes own \
    --json "$OUT/own_tuned.json" 2>&1 | grep -v Warning | tee "$OUT/own_tuned.log" ;;
esac
