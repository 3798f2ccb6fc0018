"""A diagnostic, not a product path: one B2B chain (the builder's first configuration, M = 81920)
launched a few times, so that `ncu` on the device machine can read one launch's sections.

    ncu --clock-control none --kernel-name regex:'^chain$' --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight ... python3 bench/prototypes/ncu_chain.py --chain 256,128,128
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_ring import M, kernel, label  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chain", required=True)
    parser.add_argument("--dtype", default="f16")
    args = parser.parse_args()
    from kgen import ir
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.lower import builder
    from kgen.targets import target

    k0, n0, n1 = (int(x) for x in args.chain.split(","))
    kern = kernel(args.dtype, k0, n0, n1)
    config = builder.listed(kern, target(ir.Arch.SM90A))[0][0]
    built = build(kern, ir.Arch.SM90A, source_name="chain.kg", config=config)
    report = run(built.kernel, built.plan, built.source, {"M": M}, check=True, bench=True,
                 compare_torch=False, iters=3, warmup=2, hold=False)
    print(f"{args.dtype} {args.chain} [{label(built.plan)}]: "
          f"{'ok' if report.ok else 'CHECK FAILED'} {report.timing.median_ms:.4f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
