"""A probe, not a product path: would column passes (GemmSchedule.column_passes) help the chains
whose consumer thread already fits the staging with the whole tile? N0 = 64 beside N1 = 256
holds 176 values, under the rule's 192, so it runs one pass. Lowering the limit to 160 for a
build (schedules.STAGING_MAX_VALUES) gives it two passes of 128 columns (112 values) and leaves
every other chain of the issue's table as it is.

Each chain (M = 81920) is built both ways, checked against the float64 reference with its
output poisoned and timed (kgen's timer: CUDA events, median of 30, inputs rotated past L2),
in turn over two rounds, the faster round kept; beside them a device copy of the same bytes.
`--rings`: one and two passes each on 6 and 5 ring slots (the rule's two-pass list starts at 5
slots), to tell the passes from the ring.

    bash .gpu/device-run.sh python3 bench/prototypes/passes_at_n0_64.py [--rings]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from b2b_bench import copy_ms  # noqa: E402
from chain_ring import M, kernel, label  # noqa: E402


def main() -> int:
    import dataclasses

    from kgen import ir
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.lower import builder
    from kgen.targets import target
    from kgen.targets.sm90 import schedules

    rings = "--rings" in sys.argv
    limit = schedules.STAGING_MAX_VALUES
    ok = True
    for dtype in ("f16", "bf16") if not rings else ("f16",):
        for k0 in (256, 576, 1024) if not rings else (256, 576):
            kern = kernel(dtype, k0, 64, 256)
            builds = {}
            variants = ([(f"{p} s{s}", v, s) for p, v in (("one pass", limit), ("two passes", 160))
                         for s in (6, 5)] if rings
                        else [("one pass", limit, None), ("two passes", 160, None)])
            for name, values, slots in variants:
                schedules.STAGING_MAX_VALUES = values
                config = None
                if slots is not None:
                    config = builder.listed(kern, target(ir.Arch.SM90A))[0][0]
                    config = dataclasses.replace(config, gemms=(dataclasses.replace(
                        config.gemms[0], stages=slots),) + config.gemms[1:])
                builds[name] = build(kern, ir.Arch.SM90A, source_name="chain.kg", config=config)
                schedules.STAGING_MAX_VALUES = limit
            best = {}
            for _ in range(2):
                for name, built in builds.items():
                    report = run(kern, built.plan, built.source, {"M": M}, check=True, bench=True,
                                 compare_torch=False, iters=30)
                    ok = ok and report.ok
                    best[name] = min(best.get(name, 1e9), report.timing.median_ms)
            copy = copy_ms((M * k0 + M * 256) * 2)
            print(f"\n{dtype} K0={k0} N0=64 N1=256: copy {copy:.4f} ms" + ("" if ok else "  CHECK FAILED"))
            for name, built in builds.items():
                print(f"  {name:<14} {label(built.plan):<72} {best[name]:.4f} ms "
                      f"{best[name] / copy:5.2f}x copy", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
