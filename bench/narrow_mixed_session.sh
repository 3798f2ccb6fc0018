#!/usr/bin/env bash
# One visit: the narrow entry point's producer (issue 16): an operand that meets the copy
# engine's rules still loaded by TMA. PART=bench: today's .cu against bench/baseline/narrow_mixed/
# (the golden files of the commit before), torch.matmul beside them, and the box loop unrolled
# (bench/prototypes/narrow_unroll.py); PART=tests: the GPU tests of the narrow entry point and
# compute-sanitizer on the mixed producer. Run:
# PART=... bash .gpu/device-run.sh bash bench/narrow_mixed_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
PART=${PART:-all}
cat > /tmp/mixed_check.py <<'PY'
import sys
import torch
from tests.gpu.test_narrow_mixed_gpu import _check, _kernel, _operand
torch.manual_seed(3)
which = sys.argv[1:] or ["coop", "cluster_1x2", "cluster_2x1_b_col", "pingpong"]
if "coop" in which:  # A by 8-byte copies, B by TMA
  _check(_kernel("coop"), _operand(torch, 300, 100, "row", scale=0.1), _operand(torch, 100, 264, "row"))
if "cluster_1x2" in which:  # A by element copies, B by TMA
  _check(_kernel("cluster_1x2"), _operand(torch, 77, 31, "row"), _operand(torch, 31, 264, "row"))
if "cluster_2x1_b_col" in which:  # A 2 bytes off, B by TMA in two halves
  _check(_kernel("cluster_2x1_b_col"), _operand(torch, 300, 136, "row", 1), _operand(torch, 136, 264, "col"))
if "pingpong" in which:  # A by TMA, B (N odd) by element copies
  _check(_kernel("pingpong"), _operand(torch, 129, 64, "row"), _operand(torch, 64, 257, "row"))
print("PASS", which)
PY
if [ "$PART" = all ] || [ "$PART" = bench ]; then
  echo "== before / after (narrow producer)"
  timeout 300 python3 bench/before_after.py --narrow --baseline narrow_mixed --rounds 3 \
    --kernels gemm,gemm_bias_relu,gemm_b_row \
    --shapes 4096x4096x4092,4096x4096x4094,4096x4096x4095,1000x1000x100,2048x8192x1020,3000x5000x1002,512x11008x4100 \
    --json "$OUT/before_after_narrow.json" 2>&1 | grep -v Warning | sed 's/ (errors.*//' \
    | tee "$OUT/before_after_narrow.log"
  echo "== the box loop unrolled (diagnostic)"
  timeout 200 python3 bench/prototypes/narrow_unroll.py 2>&1 | grep -v Warning | tee "$OUT/narrow_unroll.log"
fi
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  echo "== GPU tests"
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_narrow_mixed_gpu.py \
    ${ANY_SHAPE:-tests/gpu/test_any_shape_gpu.py} 2>&1 | tail -15 | tee "$OUT/pytest_narrow.log"
  # --report-api-errors no: cuda-bindings' driver loader probes cuGetProcAddress for entry points
  # the driver lacks (CUDA_ERROR_INVALID_VALUE on the host, before any kernel; memcheck_*.log)
  echo "== compute-sanitizer"
  for tool in memcheck racecheck synccheck; do
    PYTHONPATH=$PWD:$PYTHONPATH timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
      --report-api-errors no \
      python3 /tmp/mixed_check.py >/tmp/san.log 2>&1
    rc=$?
    echo "$tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASS|Error' /tmp/san.log | tail -5 | tr '\n' ' ')"
  done 2>&1 | tee "$OUT/sanitizers.log"
fi
if [ "$PART" = memcheck ]; then  # each case on its own, the reports kept
  for case in coop cluster_1x2 cluster_2x1_b_col pingpong; do
    PYTHONPATH=$PWD:$PYTHONPATH timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
      --print-limit 6 python3 /tmp/mixed_check.py $case >"$OUT/memcheck_$case.log" 2>&1
    echo "$case exit $? : $(grep -E 'ERROR SUMMARY|PASS' "$OUT/memcheck_$case.log" | tr '\n' ' ')"
  done
  PYTHONPATH=$PWD:$PYTHONPATH timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
    --print-limit 6 python3 -m kgen run examples/gemm_b_row.kg --arch sm_90a --size M=300,N=264,K=100 \
    >"$OUT/memcheck_kgen_run.log" 2>&1
  echo "kgen run gemm_b_row exit $? : $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_kgen_run.log")"
fi
if [ "$PART" = memcheck ]; then  # the same kernel from the commit before (bench/baseline/narrow_mixed/)
  cat > /tmp/old_check.py <<'PY'
from pathlib import Path
import torch
from kgen import api
from kgen.runtime.launch import CompiledKernel
from kgen.runtime.nvrtc import compile_cubin
built = api.build_file(Path("examples/gemm_b_row.kg"), "sm_90a")
src = Path("bench/baseline/narrow_mixed/gemm_b_row.sm_90a.cu").read_text()
k = CompiledKernel(built.plan, compile_cubin(src, built.plan.name, "sm_90a").cubin, source=src)
A = torch.randn(300, 100, device="cuda").half()
B = torch.randn(100, 264, device="cuda").half()
D = torch.empty(300, 264, device="cuda").half()
k(A=A, B=B, D=D, bias=torch.rand(264, device="cuda"))
torch.cuda.synchronize()
print("ran the commit before's kernel")
PY
  PYTHONPATH=$PWD:$PYTHONPATH timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
    --print-limit 6 python3 /tmp/old_check.py >"$OUT/memcheck_before.log" 2>&1
  echo "the commit before's gemm_b_row exit $? : $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_before.log")"
fi
if [ "$PART" = final ]; then  # issue 16's figures from one visit: the gelu table, aligned shapes
  echo "== the gelu table (bench/splitk_gelu.py)"
  timeout 330 python3 bench/splitk_gelu.py --json "$OUT/gelu.json" 2>&1 | grep -v Warning | tee "$OUT/gelu.log"
  echo "== aligned shapes against the .cu before issue 16 (bench/before_after.py)"
  timeout 200 python3 bench/before_after.py --rounds 3 --json "$OUT/before_after.json" 2>&1 \
    | grep -v Warning | sed 's/ (errors.*//' | tee "$OUT/before_after.log"
fi
if [ "$PART" = narrow ]; then  # the final narrow producer against the commit before
  timeout 300 python3 bench/before_after.py --narrow --baseline narrow_mixed --rounds 3 \
    --kernels gemm,gemm_bias_relu,gemm_b_row \
    --shapes 4096x4096x4092,4096x4096x4094,4096x4096x4095,1000x1000x100,2048x8192x1020,3000x5000x1002,512x11008x4100 \
    --json "$OUT/before_after_narrow.json" 2>&1 | grep -v Warning | sed 's/ (errors.*//' \
    | tee "$OUT/before_after_narrow.log"
fi
