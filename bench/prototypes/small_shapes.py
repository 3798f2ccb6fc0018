"""Small outputs (at most a wave of 128x256 tiles) on an H100/H200: the runtime sizes' choice
(`sized`: split-K with its separate <kernel>_splitk sum, or a narrow tile) against stream-K on
narrow tiles (its parts summed inside the kernel) and the plain narrow tiles, each a Schedule
value (a Config the builder fills). Checked against the reference, then timed with
torch.matmul beside it (`kgen run --bench`: CUDA events, median, inputs rotated past L2).

    bash .gpu/device-run.sh python3 bench/prototypes/small_shapes.py
"""
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE, kgen_run, label  # noqa: E402

SHAPES = [(128, 4096, 4096), (1024, 1024, 1024), (2048, 2048, 2048), (96, 12288, 4096),
          (256, 2048, 16384), (1536, 1536, 6144), (64, 8192, 4096), (512, 4096, 4096)]


def main() -> int:
    from kgen import ir
    from kgen.parse import parse
    from kgen.targets import Config, GemmConfig
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    variants = [("sized", None)]
    for tile, stages in (((128, 64, 64), 8), ((128, 128, 64), 6), ((128, 192, 64), 4),
                         ((128, 256, 64), 4)):
        variants.append((f"stream {tile[0]}x{tile[1]} s{stages}",
                         Config((GemmConfig(tile, (2, 4), stages, stream=True),))))
    variants.append(("128x64 s8", Config((GemmConfig((128, 64, 64), (2, 4), 8),))))
    best = {}
    for m, n, k in SHAPES:
        sizes = dict(M=m, N=n, K=k)
        row = {}
        torch_ms = None
        for name, config in variants:
            report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A, torch_baseline=name == "sized",
                                    config=config, sized=config is None)
            if name == "sized":
                torch_ms = report.torch_timing.median_ms
                shown_sized = label(plan)
            row[name] = (report.timing.median_ms, report.ok)
        print(f"{m}x{n}x{k}: matmul {torch_ms:.4f} ms | sized = {shown_sized}")
        for name, (ms, ok) in row.items():
            print(f"    {name:18s} {ms:.4f} ms {torch_ms / ms:.3f}x matmul{'' if ok else ' CHECK FAILED'}")
        best[m, n, k] = {name: torch_ms / ms for name, (ms, ok) in row.items() if ok}
    for name, _ in variants:
        ratios = [b[name] for b in best.values() if name in b]
        print(f"geometric mean x matmul, {name}: "
              f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over {len(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
