#!/bin/bash
# On the GPU machine (through .gpu/device-run.sh): the ping-pong example's own .cu launcher,
# which encodes D1's tensor map through the driver entry point, built with nvcc and run at a
# ragged M, a small M and M = 0 (see pingpong_launcher.cu).
set -e
cd "$(dirname "$0")"
mkdir -p gen
python3 -m kgen compile ../../examples/b2b_gemm_rf_pingpong_sm90a.kg -o gen/b2b_gemm_rf_pingpong_sm90a.cu \
  --header gen/b2b_gemm_rf_pingpong_sm90a.h
nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I gen pingpong_launcher.cu \
  gen/b2b_gemm_rf_pingpong_sm90a.cu -o /tmp/pingpong_launcher
/tmp/pingpong_launcher 81921 1000 0
