#!/usr/bin/env bash
# One visit to the GPU machine: GPU tests, compute-sanitizer on every example at a ragged size,
# and the benchmarks of bench/RESULTS.md. Run there as
#   bash .gpu/device-run.sh bash bench/gpu_session.sh
# Logs go to $OUT (or ./out when OUT is unset).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

echo "== pytest -m gpu"
python3 -m pytest -m gpu -q -x -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/pytest_gpu.log"

echo "== compute-sanitizer memcheck, ragged sizes"
for ex in examples/*.kg; do
  size=M=1000,N=1000,K=40
  case "$ex" in *b2b*) size=M=1000 ;; esac  # the b2b examples fix every size but M
  compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m kgen run "$ex" --size "$size" >"$OUT/sanitizer_$(basename "$ex" .kg).log" 2>&1
  rc=$?  # before any command substitution in the echo resets $?
  echo "$ex memcheck exit $rc : $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$(basename "$ex" .kg).log")"
done | tee "$OUT/sanitizer.log"

echo "== benchmarks"
bench() {
  python3 -m kgen run "$1" --size "$2" --bench --json >"$OUT/bench_$3.json" 2>"$OUT/bench_$3.err"
  rc=$?  # before any command substitution in the echo resets $?
  echo "$3 exit $rc"
  python3 - "$OUT/bench_$3.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps(r, indent=None)[:1500])
PY
}
bench examples/gemm.kg M=4096,N=4096,K=4096 gemm_bf16_4096
bench examples/gemm.kg M=8192,N=8192,K=8192 gemm_bf16_8192
bench examples/gemm_bias_relu.kg M=8192,N=8192,K=8192 gemm_bias_relu_f16_8192
bench examples/gemm_gelu_rowscale.kg M=8192,N=8192,K=8192 gemm_gelu_rowscale_bf16_8192
