"""Column blocks (KernelPlan.column_blocks) against the kernel each chain ran before them: the
builder's plan as it is, and with configs.column_block_counts patched to (1,) and the resident
rule's tile covering N again (no column blocks: the persistent or sm_80 tiled chain). Every variant is checked against the float64
reference with its output poisoned, then both are timed in turn (kgen's timer: CUDA events,
median of 30, inputs rotated past L2) over two rounds; the faster round of each is kept.

    bash .gpu/device-run.sh python3 bench/prototypes/column_blocks_probe.py \
        [--chains K0/N0/N1,...] [--dtypes f16,bf16] [--compile-only]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_ring import M, kernel, time_in_turn  # noqa: E402

CHAINS = [(256, 64, 640), (256, 128, 448), (576, 48, 320), (256, 160, 320), (256, 112, 320)]


def variants(kern) -> dict:
    from kgen import ir
    from kgen.api import build
    from kgen.targets.sm90 import configs

    from kgen.targets.common import schedules as common

    counts, refusal = configs.column_block_counts, common.resident_refusal

    def covering(draft, persist, first_streams=False):  # the rule before: tile N covers N
        refused = refusal(draft, persist, first_streams)
        last = draft.gemms[-1].plan
        if (refused is None and first_streams and isinstance(last.n_dim, int)
                and last.n_dim > last.tile[1]):
            return common._refused("no column blocks", common.Site("resident", 0))
        return refused

    out = {"blocks": build(kern, ir.Arch.SM90A, source_name="chain.kg")}
    configs.column_block_counts, common.resident_refusal = (lambda n: (1,)), covering
    try:
        out["before"] = build(kern, ir.Arch.SM90A, source_name="chain.kg")
    finally:
        configs.column_block_counts, common.resident_refusal = counts, refusal
    return out


def label(plan) -> str:
    return (f"{plan.schedule.kind.value} "
            + " | ".join("x".join(map(str, g.tile)) for g in plan.gemms)
            + (f" blocks {plan.column_blocks}" if plan.column_blocks > 1 else ""))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chains", help="K0/N0/N1,...")
    parser.add_argument("--dtypes", default="f16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    chains = ([tuple(map(int, c.split("/"))) for c in args.chains.split(",")] if args.chains
              else CHAINS)
    if not args.compile_only:
        from b2b_bench import copy_ms
    ok = True
    for dtype in args.dtypes.split(","):
        for k0, n0, n1 in chains:
            kern = kernel(dtype, k0, n0, n1)
            built = variants(kern)
            names = {name: label(b.plan) for name, b in built.items()}
            if args.compile_only:
                print(dtype, k0, n0, n1, names, flush=True)
                continue
            best, checked = time_in_turn(kern, {n: (b.plan, b.source) for n, b in built.items()},
                                         args.rounds, f"{dtype} {k0}/{n0}/{n1}")
            ok = ok and checked
            copy = copy_ms((M * k0 + M * n1) * 2)
            print(f"{dtype:<5} {k0:>4} {n0:>4} {n1:>4} copy {copy:.4f}  " + "  ".join(
                f"{name} [{names[name]}]: {best[name]:.4f} ({best[name] / copy:.3f})"
                for name in built), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
