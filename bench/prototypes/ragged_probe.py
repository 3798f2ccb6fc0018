"""Why 128x192 tiles lose at 3000x5000x2000 (sweep_sized.log: 0.868x torch.matmul against 0.939x
on the default 128x256), where the wave model expects them to win (4.9 waves against 3.6): the
same tiles with each of M, N and K rounded up to a multiple of 64, one at a time, to see which
ragged size costs them; and 2048^3 (64 tiles of 128x256 on 132 SMs) with stream-K. Each variant
is a Schedule value, checked against the reference, timed beside torch.matmul.

    bash .gpu/device-run.sh python3 bench/prototypes/ragged_probe.py
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE, kgen_run  # noqa: E402

SHAPES = [(3000, 5000, 2000), (3072, 5000, 2000), (3000, 5120, 2000), (3000, 5000, 2048),
          (3072, 5120, 2048), (2048, 2048, 2048)]


def main() -> int:
    from kgen import ir
    from kgen.parse import parse
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    variants = {
        "128x256 s4": Config((GemmConfig((128, 256, 64), (2, 4), 4),)),
        "128x192 s4": Config((GemmConfig((128, 192, 64), (2, 4), 4),)),
        "128x128 s6": Config((GemmConfig((128, 128, 64), (2, 4), 6),)),
        "pp 128x128 s5": Config((GemmConfig((128, 128, 64), (2, 4), 5),), KernelKind.PINGPONG),
        "stream 128x256 s3": Config((GemmConfig((128, 256, 64), (2, 4), 3, stream=True),)),
        "stream 128x192 s4": Config((GemmConfig((128, 192, 64), (2, 4), 4, stream=True),)),
    }
    for m, n, k in SHAPES:
        sizes, torch_ms, cells = dict(M=m, N=n, K=k), None, []
        for name, config in variants.items():
            report, _ = kgen_run(kernel, sizes, ir.Arch.SM90A, torch_baseline=torch_ms is None,
                                 config=config, sized=False)
            torch_ms = torch_ms or report.torch_timing.median_ms
            cells.append(f"{name} {torch_ms / report.timing.median_ms:.3f}"
                         + ("" if report.ok else " CHECK FAILED"))
        print(f"{m}x{n}x{k}: matmul {torch_ms:.4f} ms | " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
