"""Two questions from bench/prototypes/tail_probe.py's first run (issue 17, H200):

    ragged  128x192 lost to 128x256 at 3000x5000x2000 only, not at N = 4992, 5008 or 5056. Of
            those four, only N = 5000 gives D rows whose length in bytes (10000) is not a
            multiple of 32 (a sector). Other such N (4200, 5080), a sector-aligned one (6000),
            and a larger M and K at N = 5000.
    small   cuBLAS runs 64x64 tiles with a cluster of 1x2 at 128x4096x4096 and 64x128 at
            1024^3. The tuner's list holds the 64-row ping-pong tiles without clusters.

    bash .gpu/device-run.sh python3 bench/prototypes/tail_probe2.py [--part ragged small]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE, kgen_run  # noqa: E402

RAGGED = [(3000, 5000, 2000), (3000, 4200, 2000), (3000, 5080, 2000), (3000, 6000, 2000),
          (6144, 5000, 3072), (6144, 5120, 3072)]
# Shapes not probed before, to test the reading of the ragged table (128x192 pays where A's and
# B's rows, K x 2 bytes, are not 128-byte aligned and D's, N x 2 bytes, not 32-byte aligned):
# three with both misaligned, then one with K aligned and one with N aligned
VALIDATE = [(5000, 3000, 1000), (2000, 7000, 3000), (4000, 6600, 1500), (5000, 3000, 1024),
            (5000, 3008, 1000)]
SMALL = [(128, 4096, 4096), (1024, 1024, 1024), (96, 12288, 4096), (64, 8192, 4096),
         (256, 4096, 4096)]


def ragged_variants():
    from kgen.targets import Config, GemmConfig
    return {f"128x{n} s{s}": Config((GemmConfig((128, n, 64), (2, 4), s),))
            for n, s in ((256, 4), (192, 4), (128, 6))}


def small_variants():
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig
    out = {}
    for n, s in ((64, 12), (128, 8)):
        for cluster in ((1, 1), (1, 2), (2, 1)):
            name = f"pp 64x{n} s{s}" + (f" c{cluster[0]}x{cluster[1]}" if cluster != (1, 1) else "")
            out[name] = Config((GemmConfig((64, n, 64), (2, 4), s, cluster=cluster),),
                               KernelKind.PINGPONG)
    return out


def table(kernel, shapes, variants, width=15, skip=lambda shape, name: False) -> None:
    """Each variant at each shape, x torch.matmul (checked first); `skip(shape, name)`: a cell
    left out."""
    from kgen import ir
    names = list(variants)
    print(f"{'M x N x K':<18} {'matmul ms':>9} " + " ".join(f"{n:>{width}}" for n in names))
    for m, n, k in shapes:
        sizes, torch_ms, cells = dict(M=m, N=n, K=k), None, []
        for name, config in variants.items():
            if skip((m, n, k), name):
                cells.append(f"{'-':>{width}}")
                continue
            report, _ = kgen_run(kernel, sizes, ir.Arch.SM90A, torch_baseline=torch_ms is None,
                                 config=config, sized=False)
            torch_ms = torch_ms or report.torch_timing.median_ms
            cells.append(f"{torch_ms / report.timing.median_ms:>{width}.3f}"
                         if report.ok else f"{'CHECK FAILED':>{width}}")
        print(f"{f'{m}x{n}x{k}':<18} {torch_ms:>9.4f} " + " ".join(cells), flush=True)
    print("(x torch.matmul, f16, sm_90a)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", nargs="+", choices=("ragged", "small", "validate"),
                        default=["ragged", "small"])
    args = parser.parse_args()
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    if "ragged" in args.part:
        table(kernel, RAGGED, ragged_variants())
    if "small" in args.part:
        table(kernel, SMALL, small_variants())
    if "validate" in args.part:
        table(kernel, VALIDATE, ragged_variants())
    return 0


if __name__ == "__main__":
    sys.exit(main())
