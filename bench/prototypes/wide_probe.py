"""Where the sweep stays under torch.matmul (issue 17): tiles of 256 rows on the cooperative
kernel (each consumer warpgroup two m64 halves), and clusters where the output has fewer tiles
than SMs. Each variant is a Schedule value (a Config), checked against the float64 reference on
random inputs with its outputs poisoned, then timed beside torch.matmul (CUDA-event medians of
30, inputs rotated past L2).

    tiles  the builder's sized choice against 256x128 s4 and 256x160 s4 on clusters 1x1, 1x2
           and 2x1, over the bare sweep, my own shapes and shapes never probed. 3000x5000:
           128x256 tiles are 480 (3.6 waves of 132 SMs), 256x160 ones 384 (2.9); cuBLAS runs
           nvjet 152x256 there (its M is our N: our 256x152, 396 tiles, 3.0 waves)
    small  the sized choice with a cluster 2x1 and 1x2 added, where the tiles are fewer than
           the SMs (the builder and the tuner keep 1x1 there; cuBLAS runs 2x1 at 2048^3)
    rule   the wave model without 256x128 (before) and with it (after, the product path), two
           rounds, where it changes the choice: the bare GEMM (f16, bf16) and relu(alpha*acc +
           beta*C + bias[col]), at 4000x5200x2048 (seen in `tiles`) and shapes never probed
           (three from a grid, four drawn at random among the 3.5% of 3000 random shapes
           whose choice changes)

    cola   a column-major A (MN-major: its rows are M long), where the line rule does not apply
           (it asks for a K-major A): the sized choice against 128x256 s4 on each cluster, two
           rounds, at B rows that split 128-byte lines (K = 1000, 3000, 4104, 2000, 1320), A rows
           that do (M = 5000, 4104) and an aligned control

256x160 ran in `tiles` on one visit with the rules relaxed for it (bench/logs/wide/); kgen
refuses it (a consumer of 128 rows holds at most 128 columns), so `tiles` times 256x128 alone.

    bash .gpu/device-run.sh python3 bench/prototypes/wide_probe.py [--part tiles small]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE, OWN, SWEEP, kgen_run  # noqa: E402

# never probed: 256x160 fills its waves (tiles a multiple of 132 or just under) at the first
# three, 128x256 at the fourth
NEW = [(3072, 5280, 2048), (2900, 3500, 4096), (4000, 5200, 2048), (4096, 8448, 2048)]
SMALL = [(2048, 2048, 2048), (1024, 1024, 1024), (128, 4096, 4096), (512, 8192, 8192),
         (96, 12288, 4096), (256, 2048, 16384), (2048, 1024, 4096)]


def wide_variants():
    from kgen.targets import Config, GemmConfig
    out = {"sized": None}
    for tile, warps in (((256, 128, 64), (2, 4)),):
        for cluster in ((1, 1), (1, 2), (2, 1)):
            out[f"{tile[0]}x{tile[1]} c{cluster[0]}x{cluster[1]}"] = Config(
                (GemmConfig(tile, warps, 4, cluster=cluster),))
    return out


def grid(kernel, shapes, variants, width=14):
    """Each variant at each shape, x torch.matmul (checked first); a variant that returns None
    for a shape is left out."""
    from kgen import ir
    names = list(variants)
    print(f"{'M x N x K':<18} {'matmul ms':>9} " + " ".join(f"{n:>{width}}" for n in names))
    for m, n, k in shapes:
        sizes, torch_ms, cells = dict(M=m, N=n, K=k), None, []
        for name, make in variants.items():
            config = make(sizes) if callable(make) else make
            if callable(make) and config is None:
                cells.append(f"{'-':>{width}}")
                continue
            try:
                report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A,
                                        torch_baseline=torch_ms is None, config=config,
                                        sized=config is None)
            except Exception as exc:  # a refused variant: say why, go on
                print(f"  {name} at {m}x{n}x{k}: {type(exc).__name__}: {exc}"[:200])
                cells.append(f"{'ERROR':>{width}}")
                continue
            torch_ms = torch_ms or report.torch_timing.median_ms
            cells.append(f"{torch_ms / report.timing.median_ms:>{width}.3f}"
                         if report.ok else f"{'CHECK FAILED':>{width}}")
        print(f"{f'{m}x{n}x{k}':<18} {torch_ms or 0:>9.4f} " + " ".join(cells), flush=True)
    print("(x torch.matmul, f16, sm_90a, B column-major)")


def small_variants(kernel):
    from kgen.lower import builder
    from kgen.targets import target
    from kgen.targets.sm90.configs import clustered
    from kgen import ir
    tgt = target(ir.Arch.SM90A)

    def with_cluster(cluster):
        def make(sizes):
            config = builder.sized(kernel, tgt, sizes) or builder.listed(kernel, tgt)[0][0]
            return clustered(config, cluster)
        return make
    return {"sized": None, "sized c2x1": with_cluster((2, 1)), "sized c1x2": with_cluster((1, 2))}


RULE = [(4000, 5200, 2048), (3000, 7000, 4096), (4000, 5200, 4096), (8000, 5200, 4096),
        (7248, 1128, 3072), (2376, 1576, 3072), (6152, 2624, 3072), (1768, 4656, 3072)]


def rule_table():
    tiles_table({"bare": RULE, "bf16": RULE[:4], "fused": RULE[:5]}, ((256, 128),))


def tiles_table(shapes, dropped):
    """The wave model without the tiles `dropped` ((M, N) pairs of configs.SIZED_TILES; before)
    and with them (after, the product path), two rounds: each kernel named in `shapes` (bare,
    bf16, fused) at its shapes."""
    sys.path.insert(0, str(ROOT / "bench" / "prototypes"))
    from misaligned_probe import FUSED, rounds_table
    from kgen.targets.sm90 import configs
    texts = {"bare": BARE.format(t="f16"), "bf16": BARE.format(t="bf16"), "fused": FUSED}
    kernels = {name: parsed(texts[name], name) for name in shapes}
    tiles = configs.SIZED_TILES

    def patch(after):
        configs.SIZED_TILES = tiles if after else tuple(t for t in tiles if t[:2] not in dropped)
    try:
        rounds_table(kernels, shapes, patch, "before: the wave model without "
                     + " and ".join(f"{m}x{n}" for m, n in dropped))
    finally:
        configs.SIZED_TILES = tiles


COLA = [(5000, 3000, 1000), (2000, 7000, 3000), (4096, 4096, 4104), (3000, 5000, 2000),
        (6000, 4000, 1320), (5000, 3000, 1024), (4104, 4096, 4096), (4096, 4096, 4096)]


def parsed(text: str, name: str):
    """The kernel of `text`, parsed and verified."""
    from kgen.parse import parse
    from kgen.verify import verify
    module = parse(text, f"{name}.kg")
    verify(module)
    return module.kernels[0]


def cola_table():
    sys.path.insert(0, str(ROOT / "bench" / "prototypes"))
    from misaligned_probe import cluster_rounds
    cola = parsed(BARE.format(t="f16").replace("[M, K] row", "[M, K] col"), "cola")
    grid(cola, COLA, cluster_rounds(((1, 1), (2, 1), (1, 2)), sized=True), width=9)
    print("(A column-major; c: 128x256 s4 on that cluster; two rounds a, b)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", nargs="+", choices=("tiles", "small", "rule", "cola"),
                        default=["tiles", "small"])
    args = parser.parse_args()
    kernel = parsed(BARE.format(t="f16"), "bare")
    if "tiles" in args.part:
        big = [s for s in SWEEP + OWN if s[0] * s[1] >= 2048 * 4096] + NEW
        grid(kernel, big, wide_variants())
    if "small" in args.part:
        grid(kernel, SMALL, small_variants(kernel))
    if "rule" in args.part:
        rule_table()
    if "cola" in args.part:
        cola_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
