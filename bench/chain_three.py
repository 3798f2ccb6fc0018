"""A chain of three gemms on sm_90a (examples/b2b3_gemm_rf_bf16_sm90a.kg, issue 50) at M = 81920:
checked against the float64 reference (outputs poisoned), then timed by kgen's timer (CUDA
events, median of 30, inputs rotated past L2) beside the PyTorch chain (torch.matmul in bf16,
the epilogues op by op) and a device-to-device copy of the chain's bytes (A, the B operands and
vectors read, D2 written). Issue 50's mark: within 1.3x the copy. On the GPU machine:
    bash .gpu/device-run.sh python3 bench/chain_three.py [--m 81920]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

EXAMPLE = ROOT / "examples" / "b2b3_gemm_rf_bf16_sm90a.kg"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=81920)
    args = parser.parse_args()

    from b2b_bench import copy_ms
    from kgen.api import build_file
    from kgen.harness.run import run

    built = build_file(EXAMPLE)
    report = run(built.kernel, built.plan, built.source, {"M": args.m}, check=True, bench=True,
                 iters=30)
    if not report.ok:
        sys.exit(json.dumps(report.as_dict()["checks"], indent=1))
    ms, torch_ms = report.timing.median_ms, report.torch_timing.median_ms
    copy = copy_ms(report.bytes)
    print(json.dumps(dict(kernel=built.plan.name, device=report.device, m=args.m,
                          bytes=report.bytes, ms=ms, torch_ms=torch_ms, copy_ms=copy,
                          over_copy=round(ms / copy, 3), over_torch=round(ms / torch_ms, 3),
                          spill_stores=report.compile.get("spill_stores"),
                          registers=report.compile.get("registers"))))


if __name__ == "__main__":
    main()
