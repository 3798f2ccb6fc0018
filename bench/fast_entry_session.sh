#!/usr/bin/env bash
# One visit: the runtime compiles a one-gemm kernel's fast entry point alone and its narrow one on
# the first launch that needs it (nvrtc.FAST_ENTRY_ONLY). The GPU tests that launch narrow entry
# points through kgen.load and kgen run, the tuner's, and the NVRTC compile time on this machine
# of each example for sm_90a, with and without the narrow entry point (an empty cache each).
# Run: bash .gpu/device-run.sh bash bench/fast_entry_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_narrow_mixed_gpu.py \
  tests/gpu/test_any_shape_gpu.py tests/gpu/test_tune_gpu.py 2>&1 | tail -8 | tee "$OUT/pytest_fast_entry.log"
python3 - <<'PY' 2>&1 | tee "$OUT/compile_times.log"
import tempfile, time
from pathlib import Path
from kgen.api import build_file
from kgen.runtime.cache import CompileCache
from kgen.runtime.nvrtc import compile_cubin, fast_entry_options
for example in ("gemm", "gemm_bias_relu", "evt_multi_output", "evt_softmax_stats", "gemm_gelu_rowscale"):
    built = build_file(Path("examples") / f"{example}.kg", "sm_90a")
    times = {}
    for label, options in (("fast entry", fast_entry_options(built.plan.narrow_kernel)), ("both", {})):
        runs = []
        for _ in range(3):
            cache = CompileCache(Path(tempfile.mkdtemp()))
            started = time.perf_counter()
            compile_cubin(built.source, built.plan.name, "sm_90a", extra_options=options, cache=cache)
            runs.append(time.perf_counter() - started)
        times[label] = min(runs)
    print(f"{example} sm_90a NVRTC: fast entry alone {times['fast entry']:.2f} s, both {times['both']:.2f} s")
PY
