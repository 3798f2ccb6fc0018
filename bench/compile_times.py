"""NVRTC's time for the fast entry point alone of examples compiled for sm_90a, on this machine's
CPU (issue 15: under 1 s each): fastest of 3, each with an empty cache, and the epilogue's
groups (EpilogueGroups) beside it.

    python3 bench/compile_times.py [EXAMPLE ...]   (default: the five issue 15 names)
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXAMPLES = ("gemm", "gemm_bias_relu", "evt_multi_output", "evt_softmax_stats", "gemm_gelu_rowscale")


def main() -> int:
    from kgen.api import build_file
    from kgen.runtime.cache import CompileCache
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    for example in sys.argv[1:] or EXAMPLES:
        built = build_file(ROOT / "examples" / f"{example}.kg", "sm_90a")
        runs = []
        for _ in range(3):
            cache = CompileCache(Path(tempfile.mkdtemp()))
            started = time.perf_counter()
            compile_cubin(built.source, built.plan.name, "sm_90a", cache=cache,
                          extra_options=fast_entry_options(built.plan.narrow_kernel))
            runs.append(time.perf_counter() - started)
        groups = built.plan.schedule.gemms[0].groups.count
        print(f"{example} sm_90a NVRTC, fast entry alone: {min(runs):.2f} s "
              f"(runs {', '.join(f'{r:.2f}' for r in runs)}; epilogue groups {groups})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
