"""How long kgen takes to compile, on this machine's CPU:

    python3 bench/compile_times.py [EXAMPLE ...]          NVRTC's time for the fast entry point
                                                         alone, sm_90a (issue 15: under 1 s
                                                         each; default: the five issue 15 names)
    python3 bench/compile_times.py --emit [EXAMPLE ...]  `kgen compile` (emit only, no NVRTC):
                                                         the whole command's wall time, a fresh
                                                         process each, the example's own target
                                                         (DESIGN: under 0.2 s; default: every
                                                         example)
    python3 bench/compile_times.py --attention           NVRTC's time for kgen.attention's
                                                         forward programs: D 64, 128, 256, both
                                                         targets, causal and not, each mod of
                                                         bench/mods.py and dropout (issue 51:
                                                         under 2 s each)

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


ATTENTION_MODS = ("plain", "softcap", "alibi", "window", "document", "bias", "dropout")


def attention() -> None:
    """NVRTC (an empty cache, one run: the builds are seconds) of every forward program
    kgen.attention writes for the grid, from meta tensors (no GPU): B 2, 4 heads, S 1024."""
    import dataclasses

    import torch

    from kgen import attention as dense
    from kgen.api import build_verified
    from kgen.parse import parse
    from kgen.runtime.cache import CompileCache
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.verify import verify
    sys.path.insert(0, str(ROOT / "bench"))
    from mods import mod_options

    meta = dict(device="meta")
    extras = {"alibi": torch.empty(4, **meta), "document": torch.empty(2, 1024, dtype=torch.int32,
                                                                       **meta),
              "bias": torch.empty(1, 4, 1024, 1024, dtype=torch.bfloat16, **meta)}
    times = []
    for d in (64, 128, 256):
        q = torch.empty(2, 4, 1024, d, dtype=torch.bfloat16, **meta)
        for arch in ("sm_90a", "sm_80"):
            for causal in (False, True):
                for mod in ATTENTION_MODS:
                    sig = dense.signature(q, q, q, is_causal=causal, arch=arch,
                                          **mod_options(mod, causal, extras.get(mod)))
                    sig = dataclasses.replace(sig, raw_max=dense.raw_max_allowed(sig, 0.1))
                    module = parse(dense.program_text(sig), "<attention>")
                    verify(module)
                    built = build_verified(module.kernels[0], arch)
                    started = time.perf_counter()
                    result = compile_cubin(built.source, built.plan.name, arch,
                                           cache=CompileCache(Path(tempfile.mkdtemp())))
                    took = time.perf_counter() - started
                    times.append((took, f"D {d} {arch} {'causal' if causal else 'full'} {mod}"))
                    spills = result.resources().get("spill_stores", 0)
                    print(f"D {d:3} {arch:6} {'causal' if causal else 'full':6} {mod:8} NVRTC "
                          f"{took:5.2f} s" + (f"  spills {spills} B" if spills else ""),
                          flush=True)
    over = sorted((t, what) for t, what in times if t >= 2.0)
    times.sort()
    print(f"{len(times)} programs: median {times[len(times) // 2][0]:.2f} s, "
          f"{times[0][0]:.2f}-{times[-1][0]:.2f} s; {len(over)} at 2 s or more"
          + (": " + ", ".join(f"{what} {t:.2f}" for t, what in over) if over else ""))


def main() -> int:
    args = sys.argv[1:]
    if args[:1] in (["--help"], ["-h"]):
        print(__doc__)
    elif args[:1] == ["--emit"]:
        emit(args[1:])
    elif args[:1] == ["--attention"]:
        attention()
    else:
        nvrtc(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
