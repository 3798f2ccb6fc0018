"""A diagnostic, not a product path: how much of a chain's time over the copy is a fixed cost
per launch (the ring's fill before the first tile's stores, the last tiles' drain after the last
loads, the launch) and how much grows with M (issue 17, eleventh stop, H200).

For each chain (B2B_CHAIN, no schedule line, the builder's plan at each size) and M in
`--ms`: kgen's time (checked against the float64 reference with the outputs poisoned, then
timed: CUDA events, median of 30, inputs rotated past L2) beside a device copy of the same bytes
(reading A, writing D1). Then, between consecutive sizes, the marginal ratio
(chain(2M) - chain(M)) / (copy(2M) - copy(M)): the steady rate against the copy's, with the
fixed costs of both subtracted out.

    bash .gpu/device-run.sh python3 bench/prototypes/fixed_cost_probe.py \\
        [--chains f16/256/128/256,...] [--ms 40960,81920]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_ring import chain_copy_ms, chain_spec, kernel  # noqa: E402
from defaults import kgen_run, label  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chains", default="f16/256/128/256,bf16/256/128/256,f16/256/128/64,"
                        "f16/576/128/256,f16/256/64/256,f16/256/64/64")
    parser.add_argument("--ms", default="40960,81920,163840,327680")
    args = parser.parse_args()
    from kgen import ir

    sizes = [int(m) for m in args.ms.split(",")]
    print(f"{'chain':<17} {'M':>7} {'ms':>8} {'copy ms':>8} {'/copy':>6} {'marginal /copy':>15}  "
          "schedule")
    for spec in args.chains.split(","):
        dtype, k0, n0, n1 = chain_spec(spec)
        kern = kernel(dtype, k0, n0, n1)
        last = None
        for m in sizes:
            report, plan = kgen_run(kern, {"M": m}, ir.Arch.SM90A, torch_baseline=False)
            ms = report.timing.median_ms
            copy = chain_copy_ms(k0, n1, m)
            marginal = ((ms - last[0]) / (copy - last[1])) if last else None
            last = (ms, copy)
            print(f"{spec:<17} {m:>7} {ms:8.4f} {copy:8.4f} {ms / copy:6.3f} "
                  f"{f'{marginal:.3f}' if marginal else '':>15}  {label(plan)}"
                  + ("" if report.ok else "  CHECK FAILED"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
