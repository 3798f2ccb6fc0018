"""A diagnostic, not a product path: does `prefetch.tensormap` of every TMA descriptor at kernel
entry (as CUTLASS's kernels do) shorten kgen's sm_90a kernels? The first copy of each operand
otherwise fetches its 128-byte descriptor from memory first. Small kernels (1024^3 at 9 us)
would feel that most. The emitted source is edited (one thread prefetches each map of the
TensorMaps struct before anything else); each variant is checked, then both are timed in turn
over --rounds rounds (CUDA events, median of 30, inputs rotated past L2).

    bash .gpu/device-run.sh python3 bench/prototypes/tensormap_prefetch.py
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_clock import once  # noqa: E402
from chain_ring import M as CHAIN_M, kernel as chain_kernel  # noqa: E402
from defaults import BARE  # noqa: E402

BARE_SHAPES = [(1024, 1024, 1024), (128, 4096, 4096), (2048, 2048, 2048), (4096, 4096, 4096),
               (96, 12288, 4096)]
CHAINS = [(256, 128, 128), (576, 64, 64)]


def prefetched(source: str) -> str:
    body = source[source.index("struct alignas(64) TensorMaps {"):]
    body = body[:body.index("};")]
    maps = re.findall(r"unsigned long long (\w+)\[16\];", body)
    lines = "".join(f'    asm volatile("prefetch.tensormap [%0];" ::"l"(&maps.{m}) : "memory");\n'
                    for m in maps)
    return once(source, "  const int tid = threadIdx.x;\n",
                "  const int tid = threadIdx.x;\n  if (tid == 0) {  // (probe)\n" + lines + "  }\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from kgen import ir
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.lower import builder
    from kgen.parse import parse
    from kgen.targets import target
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    bare = module.kernels[0]
    cases = []
    for m, n, k in BARE_SHAPES:
        sizes = dict(M=m, N=n, K=k)
        config = builder.sized(bare, target(ir.Arch.SM90A), sizes)
        cases.append((f"{m}x{n}x{k}", build(bare, ir.Arch.SM90A, source_name="bare.kg",
                                              config=config), sizes))
    for k0, n0, n1 in CHAINS:
        kern = chain_kernel("f16", k0, n0, n1)
        config = builder.listed(kern, target(ir.Arch.SM90A))[0][0]
        cases.append((f"chain {k0}/{n0}/{n1}", build(kern, ir.Arch.SM90A,
                                                     source_name="chain.kg", config=config),
                       {"M": CHAIN_M}))
    print(f"{'case':<22} {'as emitted ms':>13} {'prefetched ms':>13} {'ratio':>7}")
    for name, built, sizes in cases:
        sources = {"as emitted": built.source, "prefetched": prefetched(built.source)}
        times = {v: [] for v in sources}
        for r in range(args.rounds):
            for v, source in sources.items():
                report = run(built.kernel, built.plan, source, sizes, check=r == 0, bench=True,
                             compare_torch=False, iters=30)
                if r == 0 and not report.ok:
                    print(f"{name} {v}: CHECK FAILED")
                times[v].append(report.timing.median_ms)
        a, b = (statistics.median(times[v]) for v in sources)
        print(f"{name:<22} {a:13.4f} {b:13.4f} {b / a:7.3f}", flush=True)
    print("(ratio: prefetched / as emitted; medians over the rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
