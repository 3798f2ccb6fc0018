"""A diagnostic: ping-pong chains with three consumer warpgroups against two (issue 17's chains
on the H200, where K0 = 256, N0 = 128 is bound by the consumers' path: bench/RESULTS.md).

Each chain's builder plan is made with two and with three consumer warpgroups
(schedules.consumer_count, patched here to return one or the other), three with each
setmaxnreg split of SPLITS (producer / consumer registers: 40/152, or 24/160). Every variant is checked against the float64 reference with its
output poisoned, then the variants are timed in turn (kgen's timer: CUDA events, median of 30,
inputs rotated past L2) over two rounds; the faster round of each is kept. ptxas' spills are
printed beside each.

    bash .gpu/device-run.sh python3 bench/prototypes/consumers_probe.py [--compile-only]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_ring import M, kernel, time_in_turn  # noqa: E402

# The first run (bench/logs/consumers/consumers.log) had N0 = 128 (spills) and a 24/160 split too
# The second (consumers_n0_64.log) these nine:
#   (256, 64, 64), (256, 64, 128), (256, 64, 256), (576, 64, 64), (576, 64, 128),
#   (576, 64, 256), (2048, 64, 64), (1024, 64, 256), (256, 96, 64)
# This one: the rule's edges, never measured before it was written
CHAINS = [(128, 64, 128), (256, 32, 128), (256, 48, 128), (192, 64, 256), (320, 64, 128),
          (256, 64, 192), (256, 64, 128)]
SPLITS = {"3 wg 40/152": (40, 152)}
TILE_CHAINS = [(256, 64, 192), (256, 128, 192), (576, 64, 192), (576, 128, 192)]


def plan_for(kern, consumers: int, split: tuple[int, int] | None):
    from kgen import ir
    from kgen.api import build
    from kgen.plan import WarpRole
    from kgen.targets.sm90 import schedules

    count, roles = schedules.consumer_count, schedules.roles
    schedules.consumer_count = lambda first, last, passes: consumers
    if split is not None:
        schedules.roles = lambda n: (WarpRole("producer", 4, registers=split[0]),
                                     WarpRole("consumer", 4, groups=n, registers=split[1]))
    try:
        return build(kern, ir.Arch.SM90A, source_name="chain.kg").plan
    finally:
        schedules.consumer_count, schedules.roles = count, roles


def tile_variants(kern, overhang: bool = False):
    """The builder's plan with the last tile's N a power of two up to 256 (the code before) and
    kept at a multiple of the 64-column box (configs.pingpong_registers' comment), or over 256
    at a multiple of 128 in column passes."""
    from kgen import ir
    from kgen.api import build
    from kgen.targets.common import configs

    from kgen.targets.sm90 import schedules

    tiles, refusal = configs.chain_tiles, schedules.tma_refusal

    def covering(last):  # the rule before: the copy engine only where the tiles cover N
        if isinstance(last.n_dim, int) and last.n_dim % last.tile[1]:
            return f"N {last.n_dim} is not a multiple of tile N {last.tile[1]}"
        return refusal(last)

    out = {}
    rules = [("power of two", False, refusal), ("boxes", True, refusal)]
    if overhang:
        rules.insert(0, ("pow2, no TMA", False, covering))
    for name, boxes, rule in rules:
        configs.chain_tiles = (lambda shapes, tile_m, tile_k=64, boxes=False, keep=boxes:
                               tiles(shapes, tile_m, tile_k, keep))
        schedules.tma_refusal = rule
        try:  # the build's own emitter: the code before ran N1 > 256 on the sm_80 chain
            built = build(kern, ir.Arch.SM90A, source_name="chain.kg")
        finally:
            configs.chain_tiles, schedules.tma_refusal = tiles, refusal
        out[name] = built.plan, built.source
    return out


def variants(kern):
    from kgen.targets.sm90 import chain as sm90_chain

    plans = {"2 wg": plan_for(kern, 2, None)}
    plans.update({name: plan_for(kern, 3, split) for name, split in SPLITS.items()})
    return {name: (plan, sm90_chain.emit(plan, source_name="chain.kg", source_hash="",
                                         command="consumers_probe.py"))
            for name, plan in plans.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--tiles", action="store_true",
                        help="N1 = 192: the last tile a power of two against the box multiple")
    parser.add_argument("--overhang", action="store_true")
    parser.add_argument("--chains", help="K0/N0/N1,... instead of the list (with --tiles: N1 "
                        "of 384 and 512 ran the sm_80 tiled chain before column passes of 128)")
    args = parser.parse_args()
    chains, make = CHAINS, variants
    if args.tiles:
        chains, make = TILE_CHAINS, tile_variants
    if args.overhang:  # also the code before the tensor map clipped columns past N
        chains, make = TILE_CHAINS, lambda kern: tile_variants(kern, overhang=True)
    if args.chains:
        chains = [tuple(map(int, c.split("/"))) for c in args.chains.split(",")]
    from kgen.runtime import compile_cubin

    if not args.compile_only:
        from b2b_bench import copy_ms
    ok = True
    for dtype in args.dtypes.split(","):
        for k0, n0, n1 in chains:
            kern = kernel(dtype, k0, n0, n1)
            texts = make(kern)
            spills = {}
            for name, (plan, text) in texts.items():
                result = compile_cubin(text, plan.name, "sm_90a")
                spills[name] = f"{result.spill_stores}/{result.spill_loads}"
            if args.compile_only:
                print(dtype, k0, n0, n1, spills, flush=True)
                continue
            best, checked = time_in_turn(kern, texts, args.rounds, f"{dtype} {k0}/{n0}/{n1}")
            ok = ok and checked
            copy = copy_ms((M * k0 + M * n1) * 2)
            print(f"{dtype:<5} {k0:>4} {n0:>4} {n1:>4} copy {copy:.4f}  " + "  ".join(
                f"{name}: {best[name]:.4f} ({best[name] / copy:.3f}, spills {spills[name]})"
                for name in texts), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
