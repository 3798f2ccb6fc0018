#!/usr/bin/env bash
# One visit after the stmatrix staging and the merge of clusters with MN-major and the staged C:
# PART=tests: the GPU tests of the warp-specialized GEMM (Hopper, staged C, MN-major, clusters),
# compute-sanitizer on the staged epilogue (cooperative, ping-pong, a cluster with C) and the .cu
# launcher; PART=bench: bench/hopper_gemm.py --quick. Logs under $OUT/stmatrix.
set -uo pipefail
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
LOGS=${OUT:-out}/stmatrix; mkdir -p "$LOGS"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
case ${PART:-tests} in
tests)
  echo "== pytest"
  timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_hopper_gpu.py \
    tests/gpu/test_staged_input_gpu.py tests/gpu/test_mn_major_gpu.py tests/gpu/test_cluster_gpu.py \
    2>&1 | tail -25 | tee "$LOGS/pytest.log"
  echo "== compute-sanitizer"
  for run in "examples/gemm_bias_relu.kg M=1000,N=1000,K=136" \
             "bench/kernels/gemm_c_pingpong_sm90a.kg M=1000,N=264,K=200" \
             "bench/kernels/gemm_c_cluster_sm90a.kg M=300,N=520,K=136"; do
    set -- $run
    for tool in memcheck racecheck synccheck; do
      timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 \
        python3 -m kgen run "$1" --arch sm_90a --size "$2" --iters 1 >/tmp/san.log 2>&1
      rc=$?  # before any command substitution in the echo resets $?
      echo "$(basename "$1") $2 $tool exit $rc : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' /tmp/san.log | tail -2 | tr '\n' ' ')"
    done
  done 2>&1 | tee "$LOGS/sanitizers.log"
  echo "== the .cu's own launcher"
  timeout 100 bash bench/smoke/gemm_launcher.sh 2>&1 | tail -6 | tee "$LOGS/launcher.log" ;;
bench)
  timeout 420 python3 bench/hopper_gemm.py --quick --json "$LOGS/hopper_gemm.json" 2>&1 \
    | grep -v Warning | tee "$LOGS/hopper_gemm.log" ;;
esac
