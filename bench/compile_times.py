"""How long kgen takes to compile, on this machine's CPU:

    python3 bench/compile_times.py [EXAMPLE ...]          NVRTC's time for the fast entry point
                                                         alone, sm_90a (issue 15: under 1 s
                                                         each; default: the five issue 15 names)
    python3 bench/compile_times.py --emit [EXAMPLE ...]  `kgen compile` (emit only, no NVRTC):
                                                         the whole command's wall time, a fresh
                                                         process each, the example's own target
                                                         (DESIGN: under 0.2 s; default: every
                                                         example)

Fastest of 3 runs each; NVRTC's with an empty cache, and the epilogue's groups (EpilogueGroups)
beside it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXAMPLES = ("gemm", "gemm_bias_relu", "evt_multi_output", "evt_softmax_stats", "gemm_gelu_rowscale")


def nvrtc(examples) -> None:
    from kgen.api import build_file
    from kgen.runtime.cache import CompileCache
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    for example in examples or EXAMPLES:
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


def emit(examples) -> None:
    names = examples or sorted(p.stem for p in (ROOT / "examples").glob("*.kg"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python keeps its bytecode
    out = Path(tempfile.mkdtemp()) / "out.cu"
    times = []
    for name in names:
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "kgen", "compile",
                            str(ROOT / "examples" / f"{name}.kg"), "-o", str(out)], env=env,
                           check=True, capture_output=True)
            runs.append(time.perf_counter() - started)
        times.append(min(runs))
        print(f"{name} kgen compile, emit only: {min(runs):.2f} s")
    times.sort()
    print(f"{len(times)} examples: median {times[len(times) // 2]:.2f} s, "
          f"{times[0]:.2f}-{times[-1]:.2f} s")


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--emit"]:
        emit(args[1:])
    else:
        nvrtc(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
