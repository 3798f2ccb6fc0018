#!/bin/bash
# On the GPU machine: build the smoke harness from pre-generated variants in bench/smoke/gen and run it.
set -e
cd "$(dirname "$0")"
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I gen main.cu -o /tmp/smoke -lcublas 2>&1 | grep -v "^$" | head -20
/tmp/smoke
