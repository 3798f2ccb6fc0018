"""A diagnostic, not a product path: the copy engine with rows 16 bytes but not 32 bytes apart.
bench/prototypes/tail_probe2.py --part validate (H100) ran the bare GEMM at 5000x3000x1000 at
0.64x torch.matmul, 2000x7000x3000 at 0.55x, where K = 1024 ran 0.95-0.98x (K = 1500, rows not
16-byte multiples, ran the narrow entry point's cp.async at 0.98x of a torch.matmul that is
slow there too). K = 1000 and 3000 give A and B rows of 2000 and 6000 bytes: 16-byte
multiples, not 32.

Variants of the configuration kgen run takes for the sizes, each checked against the reference
and timed in turn (CUDA events, median of 30, inputs rotated past L2):
    as emitted   the fast entry point, A and B by the copy engine
    cp.async     the narrow entry point, with the copy engine only for operands whose rows are
                 32-byte multiples, cp.async (16-byte chunks) for the others: the emitted source
                 edited (copy_granule tests 32 bytes) and kgen's launcher patched to match
                 (its map usable test, and the fast entry point refused for such rows)

    bash .gpu/device-run.sh python3 bench/prototypes/sector_probe.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE  # noqa: E402

SHAPES = [(5000, 3000, 1000), (2000, 7000, 3000), (5000, 3008, 1000), (3000, 5000, 2000),
          (4096, 4096, 4104), (5000, 3000, 1024)]


def edited(source: str) -> str:
    for old, new in (("| 16;\n  return static_cast<int>(bits & (~bits + 1));",
                      "| 32;\n  return static_cast<int>(bits & (~bits + 1));"),
                     ("a_granule == 16", "a_granule == 32"), ("b_granule == 16", "b_granule == 32"),
                     ("copy_granule(p.A, p.ld_A) : 16;", "copy_granule(p.A, p.ld_A) : 32;"),
                     ("copy_granule(p.B, p.ld_B) : 16;", "copy_granule(p.B, p.ld_B) : 32;")):
        assert old in source, old
        source = source.replace(old, new)
    return source


def patch() -> None:
    from kgen.runtime import launch, tma

    usable = tma.usable

    def usable32(key):
        dtype, address, rows, cols, ld = key[:5]
        return usable(key) and address % 32 == 0 and ld * dtype.nbytes % 32 == 0

    refusal = launch._fast_path_refusal

    def refusal32(plan, arrays, leading, sizes, batch_strides=None):
        why = refusal(plan, arrays, leading, sizes, batch_strides)
        if why:
            return why
        for name in ("A", "B"):
            ld = leading.get(name, 0)
            if ld and ld * 2 % 32:
                return f"{name}'s rows are not 32-byte multiples"
        return ""

    tma.usable = usable32
    launch._fast_path_refusal = refusal32


def main() -> int:
    from kgen import ir
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.lower import builder
    from kgen.parse import parse
    from kgen.targets import target
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    bare = module.kernels[0]
    print(f"{'M x N x K':<18} {'matmul ms':>9} {'as emitted':>10} {'cp.async':>10}  configuration")
    from kgen.runtime import launch, tma
    plain = (tma.usable, launch._fast_path_refusal)
    for m, n, k in SHAPES:
        sizes = dict(M=m, N=n, K=k)
        built = build(bare, ir.Arch.SM90A, source_name="bare.kg",
                      config=builder.sized(bare, target(ir.Arch.SM90A), sizes))
        times, torch_ms = {"as emitted": [], "cp.async": []}, None
        for r in range(3):
            for variant in times:
                tma.usable, launch._fast_path_refusal = plain
                source = built.source
                if variant == "cp.async":
                    patch()
                    source = edited(source)
                report = run(built.kernel, built.plan, source, sizes, check=r == 0, bench=True,
                             compare_torch=torch_ms is None, iters=30)
                torch_ms = torch_ms or report.torch_timing.median_ms
                if r == 0 and not report.ok:
                    print(f"{m}x{n}x{k} {variant}: CHECK FAILED")
                times[variant].append(report.timing.median_ms)
        tma.usable, launch._fast_path_refusal = plain
        cells = " ".join(f"{torch_ms / statistics.median(t):10.3f}" for t in times.values())
        label = f"{built.plan.schedule.kind.value} {'x'.join(map(str, built.plan.gemms[0].tile))}"
        print(f"{f'{m}x{n}x{k}':<18} {torch_ms:9.4f} {cells}  {label}", flush=True)
    print("(x torch.matmul, f16, sm_90a, the configuration kgen run takes; medians of 3 rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
