"""The chains the builder stores from registers (N0 = 128 with N1 = 256: 1.51-1.54x the copy at
K0 = 256 on an H100): what their output staging would buy. schedules.STAGING_MAX_VALUES is
raised so that the planner takes the copy engine's stores (StorePath.TMA) where the staging fits
beside a shorter ring; each variant is then a Schedule value the planner filled, checked
against the float64 reference with its output poisoned and timed beside a device copy of the
same bytes. ptxas's spills are printed: the staged epilogue spills at these sizes, which is why
the builder refuses it.

    bash .gpu/device-run.sh python3 bench/prototypes/chain_staging_probe.py
"""
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from b2b_bench import copy_ms  # noqa: E402
from chain_ring import M, kernel, label, run_config  # noqa: E402


def main() -> int:
    from kgen import ir
    from kgen.lower import builder
    from kgen.targets import target
    from kgen.targets.sm90 import schedules

    limit = schedules.STAGING_MAX_VALUES
    for dtype in ("f16", "bf16"):
        for k0, n0, n1 in ((256, 128, 256), (576, 128, 256), (256, 64, 256)):
            kern = kernel(dtype, k0, n0, n1)
            copy = copy_ms((M * k0 + M * n1) * 2)
            first = builder.listed(kern, target(ir.Arch.SM90A))[0][0]
            cells = []
            for name, stages, values in (("builder", None, limit), ("staged s5", 5, 256),
                                         ("staged s4", 4, 256), ("staged s3", 3, 256)):
                schedules.STAGING_MAX_VALUES = values
                g0 = first.gemms[0] if stages is None else dataclasses.replace(
                    first.gemms[0], stages=stages)
                got = run_config(kern, dataclasses.replace(first, gemms=(g0,) + first.gemms[1:]))
                schedules.STAGING_MAX_VALUES = limit
                if got is None:
                    cells.append(f"{name}: does not plan")
                    continue
                plan, report = got
                ms = report.timing.median_ms
                cells.append(f"{name} [{label(plan)}] {ms:.4f} ms {ms / copy:.2f}x copy, spills "
                             f"{report.compile.get('spill_stores')} B"
                             + ("" if report.ok else " CHECK FAILED"))
            print(f"{dtype} K0={k0} N0={n0} N1={n1}: copy {copy:.4f} ms\n  " + "\n  ".join(cells),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
