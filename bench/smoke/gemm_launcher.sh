#!/bin/bash
# On the GPU machine (through .gpu/device-run.sh): gemm_bias_relu compiled for sm_90a and for
# sm_80, each with its own .cu launcher (for sm_90a: tensor maps of A, B and D through the driver
# entry point) built with nvcc and run at ragged sizes, K = 0, and sizes that miss the fast entry
# point's rules (odd N or K, leading dimensions not 16-byte multiples: the launcher picks the
# narrow entry point; see gemm_launcher.cu).
set -e
cd "$(dirname "$0")"
mkdir -p gen
SIZES="1000 1000 40 4097 520 72 1 8 8 300 264 0 1000 1001 100 7 13 9 4097 129 72 2 8192 3 33 4090 1000"
python3 -m kgen compile ../../examples/gemm_bias_relu.kg --arch sm_90a -o gen/gemm_bias_relu.cu \
  --header gen/gemm_bias_relu.h
nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I gen gemm_launcher.cu \
  gen/gemm_bias_relu.cu -o /tmp/gemm_launcher
echo "sm_90a:"
/tmp/gemm_launcher $SIZES
mkdir -p gen80
python3 -m kgen compile ../../examples/gemm_bias_relu.kg --arch sm_80 -o gen80/gemm_bias_relu.cu \
  --header gen80/gemm_bias_relu.h
# sm_80 code, built for the Hopper it runs on
nvcc -std=c++17 -O2 -arch=sm_90 -I gen80 gemm_launcher.cu gen80/gemm_bias_relu.cu -o /tmp/gemm_launcher80
echo "sm_80 code:"
/tmp/gemm_launcher80 $SIZES
