#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, nvcc and cmake: generate the kernels with this checkout's
# kgen, build examples/cpp_consumer for the GPU present (90a on H100/H200) and run it, then run
# it again under compute-sanitizer's memcheck when that tool is installed. Exit 0 only if every
# run printed PASS.
#   bash examples/cpp_consumer/run_on_gpu.sh
# Settings (environment): CUDA_ARCH (default from nvidia-smi), BUILD_DIR (default
# /tmp/kgen_cpp_consumer), KGEN_PYTHON (default python3); OUT, when set, receives the logs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD_DIR:-/tmp/kgen_cpp_consumer}
python=${KGEN_PYTHON:-$(command -v python3)}
logs=${OUT:-$build/logs}
mkdir -p "$logs"

checkout=$(cd "$here/../.." && pwd)
if ! PYTHONPATH="$checkout${PYTHONPATH:+:$PYTHONPATH}" "$python" -c "import kgen.parse" 2>/dev/null
then
  echo "error: $python cannot import kgen from this checkout (lark, jinja2 and click needed)" >&2
  exit 2
fi
if [[ -z ${CUDA_ARCH:-} ]]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
  case $cap in
    90) CUDA_ARCH=90a ;;  # Hopper: the arch-specific target
    *) CUDA_ARCH=$cap ;;
  esac
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
fi
nvcc --version | tail -n 1
echo "== configure and build for sm_$CUDA_ARCH in $build (log: $logs/cpp_consumer_build.log)"
if ! { cmake -S "$here" -B "$build" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
         -DKGEN_PYTHON="$python" &&
       cmake --build "$build" -j "$(nproc)" --verbose; } >"$logs/cpp_consumer_build.log" 2>&1
then
  tail -n 40 "$logs/cpp_consumer_build.log"
  echo "cpp_consumer: build FAILED"
  exit 1
fi
grep -i warning "$logs/cpp_consumer_build.log" || echo "built without warnings"

echo "== run"
status=0
"$build/cpp_consumer" 2>&1 | tee "$logs/cpp_consumer_run.log" || status=1
if command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer --tool memcheck"
  compute-sanitizer --tool memcheck --error-exitcode 9 "$build/cpp_consumer" 2>&1 \
    | tee "$logs/cpp_consumer_memcheck.log" || status=1
fi
echo "cpp_consumer: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
