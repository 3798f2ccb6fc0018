"""The ping-pong chain's last gemm in column passes (GemmSchedule.column_passes) against the
builder's choice before them, same run: where N1 = 256 beside N0 = 128, a consumer thread held
224 values, so the output left from registers on a 6-slot ring; in two passes of 128 columns
it holds 160, and one pass's staging (32 KB for both consumers) fits beside 5 or 4 slots.

For each chain (M = 81920, `relu(relu(A @ B0 * scale0 + bias0) @ B1)`) the builder's first
three configurations (with passes: 5 and 4 slots, staged; then 6 slots, from registers), each
checked against the float64 reference with its output poisoned, then timed (kgen's timer: CUDA
events, median of 30, inputs rotated past L2), in turn over `--rounds` rounds, the faster round
kept. Beside them: a device copy of the same bytes and the PyTorch chain.

    python3 bench/column_passes.py [--rounds 2] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from b2b_bench import copy_ms, torch_chain_ms  # noqa: E402
from chain_ring import M, kernel, label, run_config  # noqa: E402

SHAPES = [(256, 128, 256), (576, 128, 256), (1024, 128, 256)]  # the last one my own


def main() -> int:
    import torch

    from kgen import ir
    from kgen.lower import builder
    from kgen.targets import target

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for dtype in ("f16", "bf16"):
        tdtype = torch.float16 if dtype == "f16" else torch.bfloat16
        for k0, n0, n1 in SHAPES:
            kern = kernel(dtype, k0, n0, n1)
            configs = [c for c, _, _ in builder.listed(kern, target(ir.Arch.SM90A))[:3]]
            best, labels, ok = {}, {}, True
            for _ in range(args.rounds):
                for i, config in enumerate(configs):
                    got = run_config(kern, config)
                    if got is None:
                        continue
                    plan, report = got
                    ok = ok and report.ok
                    labels[i] = label(plan)
                    best[i] = min(best.get(i, 1e9), report.timing.median_ms)
            copy = copy_ms((M * k0 + M * n1) * 2)
            chain_ms = torch_chain_ms(tdtype, M, k0, n0, n1)
            print(f"\n{dtype} K0={k0} N0={n0} N1={n1}: copy {copy:.4f} ms, PyTorch chain {chain_ms:.4f} ms"
                  + ("" if ok else "  CHECK FAILED"))
            for i in sorted(best):
                ms = best[i]
                print(f"  {'*' if i == 0 else ' '} {labels[i]:<70} {ms:.4f} ms {ms / copy:5.2f}x copy "
                      f"{chain_ms / ms:5.2f}x torch")
                rows.append(dict(dtype=dtype, k0=k0, n0=n0, n1=n1, schedule=labels[i], ms=ms,
                                 copy_ms=copy, torch_ms=chain_ms, builder=i == 0, ok=ok))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
