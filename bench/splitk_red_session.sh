#!/usr/bin/env bash
# One visit for issue 16's split-K with epilogue reductions: its GPU tests (both modes, both
# targets, splits 2/4/7, a batch), the zero-size GPU tests where that file exists, the sentinel
# test on examples/splitk_reductions.kg, then compute-sanitizer memcheck and racecheck on that
# example (atomic mode) and on a batched deterministic variant of it.
# Run: bash .gpu/device-run.sh bash bench/splitk_red_session.sh. Logs go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

echo "== pytest: split-K with epilogue reductions"
tests=(tests/gpu/test_splitk_reductions_gpu.py)
if [ -f tests/gpu/test_zero_sizes_gpu.py ]; then
  tests+=(tests/gpu/test_zero_sizes_gpu.py)
else
  echo "(tests/gpu/test_zero_sizes_gpu.py does not exist: skipped)"
fi
timeout 300 python3 -m pytest "${tests[@]}" -m gpu -q -p no:cacheprovider --durations=5 2>&1 \
  | tail -25 | tee "$OUT/pytest_splitk_red.log"
echo "== pytest: the sentinel test on the example"
timeout 120 python3 -m pytest tests/gpu/test_sentinel.py -m gpu -q -p no:cacheprovider \
  -k splitk_reductions 2>&1 | tail -6 | tee "$OUT/pytest_sentinel.log"

echo "== compute-sanitizer (memcheck, racecheck)"
# the deterministic mode, batched, with an odd count of workspace slots per batch
det=/tmp/splitk_red_det.kg
python3 - "$det" <<'EOF'
import sys
from tests.kernels import split_reductions_text
reductions = {"rmax": ("M", "rowmax"), "csum": ("N", "colsum"), "gmax": (None, "reduce_absmax")}
open(sys.argv[1], "w").write(split_reductions_text(deterministic=True, batched=True, split=7,
                                                   reductions=reductions))
EOF
for run in "examples/splitk_reductions.kg M=300,N=257,K=4104" "$det M=150,N=129,K=1000,L=3"; do
  set -- $run
  for tool in memcheck racecheck; do
    log="$OUT/san.log.tmp"
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 -m kgen run "$1" --arch sm_80 --size "$2" --iters 1 >"$log" 2>&1
    rc=$?  # before any command substitution in the echo resets $?
    echo "$(basename "$1") $2 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ok|FAIL' "$log" | tail -2 | tr '\n' ' ')"
  done
done | tee "$OUT/sanitizers.log"
rm -f "$OUT/san.log.tmp"
