"""A probe of a plan the builder does not make (issue 17, eleventh stop): three consumer
warpgroups at N0 = 128, each with 160 registers (setmaxnreg; the producer warpgroup keeps 32),
g0's column vectors loaded before the mainloop (GemmSchedule.early_vectors). At 152 registers
without the early vectors NVRTC spilled 36-68 bytes (the eighth stop); with them and 160, none
at N1 = 64 and 8 bytes at N1 = 128 (NVRTC 13.5).

The variant is the builder's own planning with three rules switched (schedules.consumer_count,
schedules.early_vectors, schedules.PRODUCER_REGISTERS), then emitted: no edit of emitted text.
Both are checked against the float64 reference (outputs poisoned), then timed in turn (kgen's
timer: CUDA events, median of 30, inputs rotated past L2), two rounds, the faster kept; beside
them a device copy of the same bytes.

    bash .gpu/device-run.sh python3 bench/prototypes/three_at_160_probe.py
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_ring import chain_copy_ms, chain_spec, label, time_in_turn, warm  # noqa: E402


def plan_source(text: str, three: bool):
    """(kernel, plan, source) of `text`, by the builder, or with three consumers at 160."""
    from kgen import ir
    from kgen.api import build
    from kgen.parse import parse
    from kgen.targets.sm90 import schedules as S
    from kgen.verify import verify

    module = parse(text, "chain.kg")
    verify(module)
    saved = S.consumer_count, S.early_vectors, S.PRODUCER_REGISTERS
    if three:
        S.consumer_count = lambda first, last, passes: 3
        S.early_vectors = lambda g, consumers: tuple(g.epilogue.column_vectors)
        S.PRODUCER_REGISTERS = 32
    try:
        built = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    finally:
        S.consumer_count, S.early_vectors, S.PRODUCER_REGISTERS = saved
    return built.kernel, built.plan, built.source


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chains", default="f16/256/128/64,bf16/256/128/64,f16/256/128/128,"
                        "bf16/256/128/128,f16/256/128/256@4,f16/576/128/128")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from kgen.runtime.nvrtc import compile_cubin
    from tests.kernels import b2b_chain_text

    todo = []
    for spec in args.chains.split(","):
        spec, _, slots = spec.partition("@")
        dtype, k0, n0, n1 = chain_spec(spec)
        lines = {}
        if slots:  # the ring's slots written, so that three stagings fit beside it
            lines = dict(schedule="pingpong", g0=(f"tile 64x{n0}x64 warps 4x1 stages {slots}",),
                         g1=(f"tile 64x{n1}x64 warps 4x1 stages 3", "keep B1 resident"))
        text = b2b_chain_text(dtype, k0, n0, n1, **lines)
        base = plan_source(b2b_chain_text(dtype, k0, n0, n1), False)
        three = plan_source(text, True)
        todo.append((spec + (f"@{slots}" if slots else ""), base, three))
    warm([(src, plan.name, plan.narrow_kernel) for _, *pairs in todo for _, plan, src in pairs])
    print(f"{'chain':<18} {'copy':>7} {'builder':>16} {'three at 160':>16} {'three/builder':>14}"
          "  spills (builder, three)  plans")
    for spec, base, three in todo:
        spills = [compile_cubin(src, plan.name, "sm_90a").spill_stores for _, plan, src in
                  (base, three)]
        consumers = sum(r.groups for r in three[1].schedule.warp_roles if r.name == "consumer")
        best, ok = time_in_turn(base[0], {"builder": base[1:], "three": three[1:]},
                                args.rounds, spec)
        _, k0, _, n1 = chain_spec(spec.split("@")[0])
        copy = chain_copy_ms(k0, n1)
        print(f"{spec:<18} {copy:7.4f} {best['builder']:8.4f} ({best['builder'] / copy:.3f}) "
              f"{best['three']:8.4f} ({best['three'] / copy:.3f}) "
              f"{best['three'] / best['builder']:14.3f}  {spills}  [{label(base[1])}] "
              f"[{label(three[1])}, {consumers} consumers]" + ("" if ok else "  CHECK FAILED"),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
