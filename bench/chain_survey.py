"""A CPU survey of the builder's chains for sm_90a: for each K0/N0/N1 (B2B_CHAIN with no
schedule line), the kernel kind the builder takes, each gemm's tile and stages, the last gemm's
column passes, the consumer warpgroups, and NVRTC's registers and spill bytes (fast entry point).
No GPU needed.

    python bench/chain_survey.py [--dtype f16] [--chains 256/96/320,...]
    (default: K0 in {64, 256, 1000} x N0 in {32, 64, 96, 128} x N1 in SURVEY_N1)
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kgen import ir  # noqa: E402
from kgen.api import build  # noqa: E402
from kgen.parse import parse  # noqa: E402
from kgen.runtime.nvrtc import compile_cubin, fast_entry_options  # noqa: E402
from kgen.verify import verify  # noqa: E402
from tests.kernels import B2B_CHAIN  # noqa: E402

SURVEY_K0 = (64, 256, 1000)
SURVEY_N0 = (32, 64, 96, 128)
SURVEY_N1 = (40, 72, 96, 136, 160, 200, 224, 256, 320, 384, 448, 512)


def survey_row(dtype: str, k0: int, n0: int, n1: int) -> str:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    built = build(module.kernels[0], ir.Arch.SM90A)
    schedule = built.plan.schedule
    result = compile_cubin(built.source, built.plan.name, "sm_90a",
                           extra_options=fast_entry_options(built.plan.narrow_kernel))
    tiles = " ".join(f"{'x'.join(map(str, g.tile))}s{g.stages}" for g in built.plan.gemms)
    consumer = schedule.warps.role("consumer")
    consumers = consumer.groups if consumer is not None else "-"
    spill = result.spill_stores + result.spill_loads
    return (f"{k0:5d}/{n0:3d}/{n1:3d}  {schedule.scheduler.kind.value:10s} {tiles:28s} "
            f"passes {schedule.gemms[-1].passes.count}  consumers {consumers}  "
            f"regs {result.registers}  spill {spill} B")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="f16", choices=("f16", "bf16"))
    parser.add_argument("--chains", help="K0/N0/N1,... (default: the survey's grid)")
    args = parser.parse_args()
    chains = ([tuple(map(int, c.split("/"))) for c in args.chains.split(",")] if args.chains
              else list(itertools.product(SURVEY_K0, SURVEY_N0, SURVEY_N1)))
    for k0, n0, n1 in chains:
        print(survey_row(args.dtype, k0, n0, n1), flush=True)


if __name__ == "__main__":
    main()
