#!/bin/bash
# On the GPU machine (through .gpu/device-run.sh): generate the variants, build the smoke
# harness with nvcc and cuBLAS, check every variant against a naive GPU reference, time vs cuBLAS.
set -e
cd "$(dirname "$0")"
mkdir -p gen && python3 gen.py gen
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I gen main.cu -o /tmp/smoke -lcublas 2>&1 | grep -v "^$" | head -20
/tmp/smoke
