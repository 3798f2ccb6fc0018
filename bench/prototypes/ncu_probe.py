"""A diagnostic, not a product path: one bare-GEMM configuration at one size, launched a few
times so that `ncu` (Nsight Compute, on the device machine) can read the hardware counters of
one launch (bench/RESULTS.md: 128x192 at 3000x5000x2000, and stream-K's walk).

    ncu --clock-control none --kernel-name regex:bare --launch-skip 3 --launch-count 1 \
        --metrics ... python3 bench/prototypes/ncu_probe.py --tile 128x192 --stages 4 \
        --size 3000,5000,2000 [--stream] [--cluster 2x1]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tile", default="128x256")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--size", required=True)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--cluster", default="1x1")
    args = parser.parse_args()
    from kgen import ir
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.parse import parse
    from kgen.targets import Config, GemmConfig
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    tm, tn = (int(x) for x in args.tile.split("x"))
    m, n, k = (int(x) for x in args.size.split(","))
    built = build(module.kernels[0], ir.Arch.SM90A, source_name="bare.kg", config=Config(
        (GemmConfig((tm, tn, 64), (2, 4), args.stages, stream=args.stream,
                    cluster=tuple(int(x) for x in args.cluster.split("x"))),)))
    report = run(built.kernel, built.plan, built.source, dict(M=m, N=n, K=k), check=True,
                 bench=True, compare_torch=False, iters=3, warmup=2, hold=False)
    print(f"{args.tile} s{args.stages}{' stream' if args.stream else ''} {m}x{n}x{k}: "
          f"{'ok' if report.ok else 'CHECK FAILED'} {report.timing.median_ms:.4f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
