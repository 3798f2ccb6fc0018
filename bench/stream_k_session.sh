#!/usr/bin/env bash
# One visit for stream-K on the cooperative kernel (`split stream`): its GPU tests, the
# sanitizers on it, then bench/stream_k.py. PART=tests | bench | all (default).
# Run: bash .gpu/device-run.sh bash bench/stream_k_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
# the sanitizers' kernel: examples/gemm_bias_relu.kg (a staged C) on stream-K
python3 - <<'PY'
text = open("examples/gemm_bias_relu.kg").read().replace("target sm_80", "target sm_90a").replace(
    "tile 128x256x64  warps 2x4  stages 3", "tile 128x128x64  warps 2x4  stages 5  split stream")
open("/tmp/stream_k.kg", "w").write(text)
PY
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  echo "== pytest tests/gpu/test_stream_k_gpu.py"
  timeout 260 python3 -m pytest tests/gpu/test_stream_k_gpu.py -m gpu -q -x -p no:cacheprovider \
    2>&1 | tail -25 | tee "$OUT/pytest_stream_k.log"
  echo "== compute-sanitizer: stream-K, fast and narrow entry points, staged C"
  for size in ${SAN_SIZES:-M=200,N=264,K=3000 M=77,N=131,K=1001}; do
    for tool in memcheck racecheck synccheck; do
      timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run /tmp/stream_k.kg --size $size --iters 1 >/tmp/san.log 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "stream_k $size $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/sanitizers_stream_k.log"
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  echo "== bench/stream_k.py --part ${BENCH_PARTS:-bare fused}"
  timeout ${BENCH_TIMEOUT:-300} python3 bench/stream_k.py --part ${BENCH_PARTS:-bare fused} \
    --json "$OUT/stream_k.json" 2>&1 | grep -v Warning | tee "$OUT/stream_k.log"
fi
# PART=final: the GPU tests again after the fixup's adds moved to a share at a time, the
# sanitizers at both sizes, the split-K and tuner GPU tests beside them, and `kgen tune` of the
# bare GEMM at 3000x1000x8000 (where stream-K won) with its table
if [ "$PART" = final ]; then
  echo "== pytest: stream-K, split-K on the cooperative kernel, kgen tune"
  timeout 300 python3 -m pytest tests/gpu/test_stream_k_gpu.py tests/gpu/test_any_shape_gpu.py \
    tests/gpu/test_tune_gpu.py -m gpu -q -p no:cacheprovider -k "stream or split or tune" 2>&1 \
    | tail -15 | tee "$OUT/pytest_final.log"
  for size in M=200,N=264,K=3000 M=77,N=131,K=1001; do
    for tool in memcheck racecheck synccheck; do
      timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run /tmp/stream_k.kg --size $size --iters 1 >/tmp/san.log 2>&1
      rc=$?
      echo "stream_k $size $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/sanitizers_final.log"
  python3 - <<'PY'
import sys
sys.path.insert(0, "bench")
from defaults import BARE
open("/tmp/bare.kg", "w").write(BARE.format(t="f16"))
PY
  echo "== kgen tune /tmp/bare.kg --size M=3000,N=1000,K=8000"
  timeout 150 python3 -m kgen tune /tmp/bare.kg --size M=3000,N=1000,K=8000 2>&1 | grep -v Warning \
    | tail -30 | tee "$OUT/tune_3000x1000x8000.log"
fi
