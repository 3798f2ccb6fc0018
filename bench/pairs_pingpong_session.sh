#!/usr/bin/env bash
# One visit: ping-pong first where the output leaves as pairs (kgen/targets/sm90/configs.py,
# PINGPONG_PAIRS_STAGES). PART=tests: the GPU tests of the builder's choices, kgen run, the EVT
# ops, reductions and the tuner; then NVRTC's time for the fast entry point alone of the five
# examples issue 15 names (this machine's CPU, fastest of 3, empty caches).
# Run: bash .gpu/device-run.sh bash bench/pairs_pingpong_session.sh. Logs in $OUT.
. "$(dirname "$0")/session_head.sh"
timeout ${TESTS_S:-380} python3 -m pytest -q -m gpu -p no:cacheprovider ${SUITES:-tests/gpu/test_builder_gpu.py \
  tests/gpu/test_run_gpu.py tests/gpu/test_evt_gpu.py tests/gpu/test_reductions_gpu.py \
  tests/gpu/test_tune_gpu.py} 2>&1 | tail -12 | tee "$OUT/pytest_pairs_pingpong.log"
python3 - <<'PY' 2>&1 | tee "$OUT/compile_times.log"
import tempfile, time
from pathlib import Path
from kgen.api import build_file
from kgen.runtime.cache import CompileCache
from kgen.runtime.nvrtc import compile_cubin, fast_entry_options
for example in ("gemm", "gemm_bias_relu", "evt_multi_output", "evt_softmax_stats", "gemm_gelu_rowscale"):
    built = build_file(Path("examples") / f"{example}.kg", "sm_90a")
    runs = []
    for _ in range(3):
        cache = CompileCache(Path(tempfile.mkdtemp()))
        started = time.perf_counter()
        compile_cubin(built.source, built.plan.name, "sm_90a", cache=cache,
                      extra_options=fast_entry_options(built.plan.narrow_kernel))
        runs.append(time.perf_counter() - started)
    groups = built.plan.schedule.gemms[0].epilogue_groups
    print(f"{example} sm_90a NVRTC, fast entry alone: {min(runs):.2f} s "
          f"(runs {', '.join(f'{r:.2f}' for r in runs)}; epilogue groups {groups})")
PY
