"""64-row ping-pong tiles on an H100/H200 (each consumer warpgroup a 64xN tile of its own, one
m64 wgmma row): where 128-row tiles leave SMs idle, against the runtime sizes' choice (`sized`)
and torch.matmul. Each variant is a Schedule value (a Config the builder fills), checked against
the reference, then timed (`kgen run --bench`: CUDA events, median, inputs rotated past L2).

    bash .gpu/device-run.sh python3 bench/small_tiles.py [f16|bf16]

KGEN_SMALL=stages times the ring depths instead; KGEN_SMALL=rule times the runtime sizes' choice
(configs.sized, with 64-row tiles) against the same rule without them (configs.SIZED_TILES'
128-row entries, split-K at any M), on a bare, a fused and a batched kernel.
"""
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE, kgen_run, label  # noqa: E402

# the sweep's small outputs and misses, then shapes of our own
SHAPES = [(128, 4096, 4096), (1024, 1024, 1024), (2048, 2048, 2048), (3000, 5000, 2000),
          (512, 8192, 8192), (16384, 1024, 1024),
          (64, 8192, 4096), (96, 12288, 4096), (256, 2048, 16384), (512, 4096, 4096),
          (1536, 1536, 6144), (768, 3072, 1024)]
VARIANTS = (((64, 64, 64), 8), ((64, 128, 64), 8), ((64, 192, 64), 6), ((64, 256, 64), 4))
# the ring's depth on the tiles that won (KGEN_SMALL=stages)
STAGES = (((64, 64, 64), 8), ((64, 64, 64), 12), ((64, 64, 64), 16), ((64, 128, 64), 6),
          ((64, 128, 64), 10), ((64, 192, 64), 4), ((64, 192, 64), 7), ((64, 256, 64), 5))
STAGE_SHAPES = [(128, 4096, 4096), (64, 8192, 4096), (96, 12288, 4096), (1024, 1024, 1024),
                (192, 6144, 4096), (64, 4096, 8192), (320, 2048, 4096), (128, 8192, 2048)]


FUSED = """\
kernel fused {{
  target sm_90a
  tensor A : {t}[M, K] row
  tensor B : {t}[K, N] col
  tensor C : {t}[M, N] row
  tensor D : {t}[M, N] row out
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  scalar beta : f32 = 0.5
  gemm g = A @ B accumulate f32 {{
    epilogue {{ D = relu(alpha * acc + beta * C + bias[col]) }}
  }}
}}
"""
BATCHED = """\
kernel batched {{
  target sm_90a
  tensor A : {t}[L, M, K] row
  tensor B : {t}[L, K, N] col
  tensor D : {t}[L, M, N] row out
  vector bias : f32[L, N]
  gemm g = A @ B accumulate f32 {{
    epilogue {{ D = acc + bias[col] }}
  }}
}}
"""
RULE_SHAPES = {
    "bare": [(128, 4096, 4096), (64, 8192, 4096), (64, 4096, 8192), (1024, 1024, 1024),
             (96, 12288, 4096), (192, 6144, 4096), (320, 2048, 4096), (128, 8192, 2048),
             (160, 5120, 3072), (64, 2048, 2048)],
    "fused": [(128, 4096, 4096), (1024, 1024, 1024), (192, 6144, 4096), (320, 2048, 4096)],
    "batched": [(4096, 64, 128, 64), (4096, 64, 128, 2048), (64, 96, 1024, 1024),
                (512, 64, 256, 512)],
}


def without_small_tiles():
    """configs.sized as it was before the 64-row tiles (the old rule)."""
    import contextlib

    from kgen.targets.sm90 import configs

    @contextlib.contextmanager
    def old():
        saved = configs.SIZED_TILES, configs.SIZED_ONE_ROW
        configs.SIZED_TILES = tuple(t for t in saved[0] if t[0] == 128)
        configs.SIZED_ONE_ROW = 0
        try:
            yield
        finally:
            configs.SIZED_TILES, configs.SIZED_ONE_ROW = saved
    return old()


def rule(dtype: str) -> int:
    from kgen import ir
    from kgen.lower import builder
    from kgen.parse import parse
    from kgen.targets import target
    from kgen.verify import verify

    print(f"the runtime sizes' choice with 64-row tiles (new) and without (old), {dtype}: "
          "time x PyTorch's (torch.matmul, or its unfused epilogue, or torch.bmm)")
    ratios: dict[str, list[float]] = {"new": [], "old": []}
    for which, text in (("bare", BARE), ("fused", FUSED), ("batched", BATCHED)):
        module = parse(text.format(t=dtype), f"{which}.kg")
        verify(module)
        kernel = module.kernels[0]
        for shape in RULE_SHAPES[which]:
            sizes = dict(zip("LMNK" if len(shape) == 4 else "MNK", shape))
            new = builder.sized(kernel, target(ir.Arch.SM90A), sizes)
            with without_small_tiles():
                old = builder.sized(kernel, target(ir.Arch.SM90A), sizes)
            cells, torch_ms = [], None
            for name, config in (("new", new), ("old", old)):
                if name == "old" and old == new:
                    cells.append("old: the same")
                    ratios[name].append(ratios["new"][-1])
                    continue
                report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A,
                                        torch_baseline=name == "new", config=config,
                                        sized=False)
                if name == "new":
                    torch_ms = report.torch_timing.median_ms
                ratio = torch_ms / report.timing.median_ms
                ratios[name].append(ratio)
                cells.append(f"{name} {label(plan)} {ratio:.3f}"
                             f"{'' if report.ok else ' CHECK FAILED'}")
            print(f"{which} {'x'.join(map(str, shape))}: torch {torch_ms:.4f} ms | "
                  + " | ".join(cells), flush=True)
    for name, values in ratios.items():
        print(f"geometric mean x PyTorch, {name}: "
              f"{math.exp(sum(map(math.log, values)) / len(values)):.3f} over {len(values)}")
    return 0


def main() -> int:
    from kgen import ir
    from kgen.parse import parse
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig
    from kgen.verify import verify

    dtype = sys.argv[1] if len(sys.argv) > 1 else "f16"
    if os.environ.get("KGEN_SMALL") == "rule":
        return rule(dtype)
    module = parse(BARE.format(t=dtype), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    stages = os.environ.get("KGEN_SMALL") == "stages"
    variants = [("sized", None)]
    variants += [(f"pp {t[0]}x{t[1]} s{s}", Config((GemmConfig(t, (2, 4), s),),
                                                   KernelKind.PINGPONG, "bench"))
                 for t, s in (STAGES if stages else VARIANTS)]
    print(f"bare GEMM, {dtype}, sm_90a: time x torch.matmul's (higher is faster)")
    ratios: dict[str, list[float]] = {name: [] for name, _ in variants}
    for m, n, k in STAGE_SHAPES if stages else SHAPES:
        sizes = dict(M=m, N=n, K=k)
        torch_ms, cells, shown = None, [], ""
        for name, config in variants:
            report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A,
                                    torch_baseline=name == "sized", config=config,
                                    sized=config is None)
            if name == "sized":
                torch_ms, shown = report.torch_timing.median_ms, label(plan)
            ratio = torch_ms / report.timing.median_ms
            if report.ok:
                ratios[name].append(ratio)
            cells.append(f"{name} {ratio:.3f}{'' if report.ok else ' CHECK FAILED'}")
        print(f"{m}x{n}x{k}: matmul {torch_ms:.4f} ms | sized = {shown} | " + "  ".join(cells),
              flush=True)
    for name, values in ratios.items():
        print(f"geometric mean x matmul, {name}: "
              f"{math.exp(sum(map(math.log, values)) / len(values)):.3f} over {len(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
