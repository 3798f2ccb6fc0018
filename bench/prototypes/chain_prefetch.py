"""A diagnostic, not a product path: would the ping-pong chain's consumers wait less for A if the
producer prefetched A's boxes into L2 some tiles ahead? The clock reads of the final code
(bench/RESULTS.md, 2026-11-27) had each consumer waiting 995 cycles a tile for its slots to fill
at 256/128/128 on an H200, while the producer waited 67% of its time for empty slots: the ring
was full, and its fills were still in flight from DRAM.

The builder's first configuration for each chain (M = 81920) is emitted, and the producer's
tile loop is edited to issue cp.async.bulk.prefetch.tensor for every k tile's A box of the
CTA's tile D tiles ahead (D = 0: as emitted). Every variant is checked against the float64
reference with its outputs poisoned, then timed in turn over --rounds rounds (CUDA events,
median of 30, inputs rotated past L2), beside a device copy of the same bytes.

    bash .gpu/device-run.sh python3 bench/prototypes/chain_prefetch.py [--ahead 0 1 2 4] [--rounds 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from b2b_bench import copy_ms  # noqa: E402
from chain_clock import once  # noqa: E402
from chain_ring import ISSUE, M, kernel, label  # noqa: E402

PREFETCH = """
// (probe) The box of `map` at (col, row) into L2 only.
__device__ __forceinline__ void probe_prefetch_box(const void* map, int col, int row) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\\n" ::"l"(map), "r"(col),
               "r"(row)
               : "memory");
}
"""


def prefetched(source: str, ahead: int) -> str:
    if ahead == 0:
        return source
    head = "__device__ __forceinline__ void produce_ring("
    source = once(source, head, PREFETCH + head)
    loop = ("    const int m0 = tile_m * kTileM;\n"
            "    for (int kt = 0; kt < k_tiles; ++kt, ++fill) {\n"
            "      const int slot = fill % kStages;\n")
    return once(source, loop,
                "    const int m0 = tile_m * kTileM;\n"
                f"    if (tile + {ahead} * gridDim.x < tiles_m * tiles_n) {{  // (probe) A's boxes {ahead} tiles ahead\n"
                "      int ahead_m, ahead_n;\n"
                f"      tile_coords(tile + {ahead} * gridDim.x, tiles_m, tiles_n, ahead_m, ahead_n);\n"
                "      for (int kt = 0; kt < k_tiles; ++kt) probe_prefetch_box(&maps.A, kt * kTileK, ahead_m * kTileM);\n"
                "    }\n" + loop[len("    const int m0 = tile_m * kTileM;\n"):])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ahead", nargs="+", type=int, default=[0, 1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", nargs="+", default=["f16"])
    args = parser.parse_args()
    from kgen import ir
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.lower import builder
    from kgen.targets import target

    print(f"{'chain':<16} {'configuration':<62} {'copy ms':>8} "
          + " ".join(f"{f'D={d} ms':>9} {'/copy':>6}" for d in args.ahead))
    for dtype in args.dtype:
        for k0, n0, n1 in ISSUE:
            kern = kernel(dtype, k0, n0, n1)
            config = builder.listed(kern, target(ir.Arch.SM90A))[0][0]
            built = build(kern, ir.Arch.SM90A, source_name="chain.kg", config=config)
            if "produce_ring(const chain_params& p, const TensorMaps& maps" not in built.source:
                print(f"{dtype} {k0}/{n0}/{n1}: no TMA producer ({label(built.plan)})")
                continue
            sources = {d: prefetched(built.source, d) for d in args.ahead}
            times = {d: [] for d in args.ahead}
            for r in range(args.rounds):
                for d in args.ahead:
                    report = run(built.kernel, built.plan, sources[d], {"M": M}, check=r == 0,
                                 bench=True, compare_torch=False, iters=30)
                    if r == 0 and not report.ok:
                        print(f"{dtype} {k0}/{n0}/{n1} D={d}: CHECK FAILED")
                    times[d].append(report.timing.median_ms)
            copy = copy_ms((M * k0 + M * n1) * 2)
            cells = []
            for d in args.ahead:
                ms = statistics.median(times[d])
                cells.append(f"{ms:9.4f} {ms / copy:6.3f}")
            print(f"{f'{dtype} {k0}/{n0}/{n1}':<16} {label(built.plan):<62} {copy:8.4f} "
                  + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
