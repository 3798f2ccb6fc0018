"""One Schedule value of the builder's ping-pong chain plan, set to each of several values, the
variants timed in turn (issue 17's chains on the H200). A variant is the plan with that value
of one gemm's GemmSchedule replaced, then emitted: no edit of emitted text.

    bash .gpu/device-run.sh python3 bench/prototypes/schedule_value_probe.py \\
        --field passes_in_flight --values 1,2 [--gemm -1 | --map A] [--chains 256/128/256,...]
        [--dtypes f16,bf16] [--rounds 2]

Every variant is first checked against the float64 reference with its output poisoned, then all
are timed in turn (kgen's timer: CUDA events, median of 30, inputs rotated past L2) over
`--rounds` rounds, the fastest kept. Beside them: a device copy of the same bytes. The sources
are compiled first in parallel processes (one per core) into the cubin cache.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from chain_ring import M, kernel, label, time_in_turn, warm  # noqa: E402
from tests.kernels import with_gemm_schedule  # noqa: E402

CHAINS = "256/128/256,576/128/256,256/128/320,1000/64/320,256/96/256,256/128/448,256/128/384"


def variants(kern, gemm: int, field: str, values: list, tensor_map: str | None = None):
    """{value: (plan, source)}: the builder's plan with gemm `gemm`'s `field` set to each (or,
    with `tensor_map`, that field of the schedule's tensor map of that parameter)."""
    from kgen import ir
    from kgen.api import build
    from kgen.targets.sm90 import chain as sm90_chain

    plan = build(kern, ir.Arch.SM90A, source_name="chain.kg").plan
    out = {}
    for value in values:
        if tensor_map is None:
            var = with_gemm_schedule(plan, gemm, **{field: value})
        else:
            maps = tuple(dataclasses.replace(m, **{field: value}) if m.param == tensor_map
                         else m for m in plan.schedule.tensor_maps)
            var = dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule,
                                                                         tensor_maps=maps))
        out[str(value)] = (var, sm90_chain.emit(var, source_name="chain.kg", source_hash="",
                                                command="schedule_value_probe.py"))
    return plan, out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--field", required=True)
    parser.add_argument("--values", required=True, help="Python literals, comma-separated")
    parser.add_argument("--gemm", type=int, default=-1)
    parser.add_argument("--map", default=None, help="vary this parameter's tensor map instead")
    parser.add_argument("--chains", default=CHAINS)
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from b2b_bench import copy_ms

    values = [ast.literal_eval(v) for v in args.values.split(",")]
    names = [str(v) for v in values]
    chains = [tuple(map(int, c.split("/"))) for c in args.chains.split(",")]
    todo = [(dtype, chain, variants(kernel(dtype, *chain), args.gemm, args.field, values,
                                    args.map))
            for dtype in args.dtypes.split(",") for chain in chains]
    warm([(text, var.name, var.narrow_kernel) for _, _, (_, texts) in todo
          for var, text in texts.values()])
    print(f"{args.field} of " + (f"gemm {args.gemm}" if args.map is None else
                                 f"the tensor map of {args.map}")
          + ": the builder's value in brackets in each label")
    print(f"{'dtype':<5} {'K0':>5} {'N0':>4} {'N1':>4} {'schedule':<60} "
          + " ".join(f"{n:>8}" for n in names) + f" {'copy':>7} "
          + " ".join(f"{n + '/c':>8}" for n in names) + "  " + " ".join(
              f"{n + '/' + names[0]:>8}" for n in names[1:]))
    ok = True
    for dtype, (k0, n0, n1), (plan, texts) in todo:
        kern = kernel(dtype, k0, n0, n1)
        best, good = time_in_turn(kern, texts, args.rounds, f"{dtype} {k0}/{n0}/{n1}")
        ok &= good
        copy = copy_ms((M * k0 + M * n1) * 2)
        builder = (getattr(plan.schedule.gemms[args.gemm], args.field) if args.map is None else
                   next(getattr(m, args.field) for m in plan.schedule.tensor_maps
                        if m.param == args.map))
        print(f"{dtype:<5} {k0:>5} {n0:>4} {n1:>4} {f'[{builder}] ' + label(plan):<60} "
              + " ".join(f"{best[n]:8.4f}" for n in names) + f" {copy:7.4f} "
              + " ".join(f"{best[n] / copy:8.3f}" for n in names) + "  "
              + " ".join(f"{best[n] / best[names[0]]:8.3f}" for n in names[1:]), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
