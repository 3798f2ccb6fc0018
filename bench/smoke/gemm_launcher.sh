#!/bin/bash
# On the GPU machine (through .gpu/device-run.sh): gemm_bias_relu compiled for sm_90a, its own
# .cu launcher (tensor maps of A, B and D through the driver entry point) built with nvcc and run
# at ragged sizes and K = 0 (see gemm_launcher.cu).
set -e
cd "$(dirname "$0")"
mkdir -p gen
python3 -m kgen compile ../../examples/gemm_bias_relu.kg --arch sm_90a -o gen/gemm_bias_relu.cu \
  --header gen/gemm_bias_relu.h
nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I gen gemm_launcher.cu \
  gen/gemm_bias_relu.cu -o /tmp/gemm_launcher
/tmp/gemm_launcher 1000 1000 40 4097 520 72 1 8 8 300 264 0
