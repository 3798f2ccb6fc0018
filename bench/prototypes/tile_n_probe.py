"""128-row cooperative tiles of 144, 160 and 176 columns (issue 17): the waves' other widths.
cuBLAS runs 1536x1536x6144 on one wave of 132 tiles (nvjet 144x128 on a cluster 1x2, 39.5 us on
an H200), where kgen's 128x192 makes 96 tiles (49 us). Each variant is a Schedule value (a
Config), checked against the float64 reference on random inputs with its outputs poisoned,
then timed beside torch.matmul (CUDA-event medians of 30, inputs rotated past L2).

    cost   each tile's time per output element against 128x256 s4's, where every tile fills
           exactly four waves of 132 SMs (M = 33 tile rows, N = 16 tile columns), K = 2048 and
           6144, two rounds: the wave model's per-element cost (configs.SIZED_TILES)
    grid   the sized choice against 128x144, 128x160 and 128x176 on 4 stages at shapes where
           one of them fills the waves better (drawn at random, seed 5, from the ~11% of 3000
           random shapes whose choice the new widths change at guessed costs), and 1536^2x6144
    rule   the wave model without the new widths (before) and with them (after, the product
           path), two rounds, where the choice changes: the bare GEMM (f16, bf16) and
           relu(alpha*acc + beta*C + bias[col])
    recheck  1608x1504 at K = 6992 and 7040, sized against 128x160 and 128x176, two rounds
    cost128  the wave model with 128x128 weighed at its measured 1.11 against 1.06 (not kept)
    wide   the 256-row tiles' costs per element on the same basis as `cost`
    splitc the sized split-K against the same on a cluster 2x1 and 1x2, two rounds
    profile  kernel device times (torch.profiler) of the sized split-K, its main kernel and
           its sum apart, and of torch.matmul

Every distinct source is compiled first, in parallel processes (kgen.tune.compile), into the
visit's cubin cache.

    bash .gpu/device-run.sh python3 bench/prototypes/tile_n_probe.py [--part cost grid ...]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from defaults import BARE, kgen_run  # noqa: E402
from wide_probe import grid, parsed, tiles_table  # noqa: E402

WIDTHS = (144, 160, 176)
# (tile N, stages): the new widths on 4 and 5 stages, the weighed neighbours
COST_TILES = ((144, 4), (144, 5), (160, 4), (160, 5), (176, 4), (176, 5), (128, 6), (192, 4),
              (256, 4))
COST_K = (2048, 6144)
GRID = [(1536, 1536, 6144),
        (1576, 1696, 6632), (2800, 976, 5184), (1256, 2216, 3296),  # 128x176 at guessed costs
        (4632, 6200, 1536), (1608, 1504, 6992), (5568, 4784, 8192), (664, 3368, 960),  # 160
        (1792, 2464, 8064), (7280, 1848, 6464), (2064, 3176, 5376), (2408, 792, 4056)]  # 144
# the rule's shapes: 1536^2x6144 and two of the grid, then twelve never probed, drawn (seed 1)
# among the 6% of 3000 random shapes (seed 31) whose choice the new widths change
RULE = [(1536, 1536, 6144), (2408, 792, 4056), (1608, 1504, 6992),
        (7296, 280, 5680), (1968, 6352, 2216), (2848, 848, 4512), (3560, 3800, 6400),
        (5856, 2320, 3584), (2560, 4536, 2816), (5560, 3112, 2176), (3688, 520, 3728),
        (5264, 464, 8112), (7792, 6560, 8192), (1288, 3672, 3904), (1024, 5328, 3392),
        (3000, 1936, 4096)]  # 264 of 128x176 (two waves) against 132 of 256x176 (one)
SOME = [RULE[0], RULE[3], RULE[5], RULE[6], RULE[12], RULE[15]]
# misaligned B rows (K = 6992: 32-byte multiples) against the aligned neighbour, two rounds
RECHECK = [(1608, 1504, 6992), (1608, 1504, 7040)]


# the 256-row tiles on the same basis (M = 33 tile rows of 256), with 128x256 and 128x128 again
COST_WIDE = ((256, 128, 4), (256, 192, 3), (256, 152, 4), (128, 256, 4), (128, 128, 6))


def config(n, stages, m=128):
    from kgen.targets import Config, GemmConfig
    return Config(((GemmConfig((m, n, 64), (2, 4), stages)),))


def warm(kernel, configs):
    """Compile every distinct source of `configs` (None: the builder's default) in parallel."""
    from kgen import ir
    from kgen.api import build
    from kgen.tune.compile import Job, compile_all
    sources = {}
    for c in configs:
        built = build(kernel, ir.Arch.SM90A, source_name="bench.kg", config=c)
        sources.setdefault(built.source, built.plan)
    jobs = [Job(i, src, plan.name, "sm_90a", plan.narrow_kernel)
            for i, (src, plan) in enumerate(sources.items())]
    results = compile_all(jobs)
    bad = [r for r in results.values() if not r.ok or r.local_memory]
    print(f"warmed {len(jobs)} sources; {len(bad)} failed or spilled", flush=True)
    for r in bad:
        print("  ", r.error[:300] or r.local_memory)


def cost_table(kernel, tiles=None):
    from kgen import ir
    tiles = tiles or tuple((128, n, s) for n, s in COST_TILES)
    print(f"{'tile':<12} {'K':>5} {'M x N':<12} {'ms a':>8} {'ms b':>8} {'x matmul':>8} "
          f"{'ns/elem/k-tile':>14} {'cost':>6}")
    base = {}
    for k in COST_K:
        for tm, n, stages in sorted(tiles, key=lambda t: t != (128, 256, 4)):
            m, width = 33 * tm, 16 * n
            sizes = dict(M=m, N=width, K=k)
            times, torch_ms = [], None
            for _ in range(2):
                report, _ = kgen_run(kernel, sizes, ir.Arch.SM90A,
                                     torch_baseline=torch_ms is None,
                                     config=config(n, stages, tm),
                                     sized=False)
                assert report.ok, f"{tm}x{n} s{stages} at {sizes}: check failed"
                torch_ms = torch_ms or report.torch_timing.median_ms
                times.append(report.timing.median_ms)
            best = min(times)
            per = best * 1e6 / (m * width) / (k / 64)
            if (tm, n, stages) == (128, 256, 4):
                base[k] = per
            print(f"{tm}x{n} s{stages:<5} {k:>5} {f'{m}x{width}':<12} {times[0]:>8.4f} "
                  f"{times[1]:>8.4f} {torch_ms / best:>8.3f} {per * 1e3:>14.4f} "
                  f"{per / base[k]:>6.3f}", flush=True)
    print("(cost: time per output element over 128x256 s4's at the same K; four whole waves)")


def grid_variants():
    out = {"sized": None}
    out.update({f"128x{n} s4": config(n, 4) for n in WIDTHS})
    return out


def rule_kernels():
    from misaligned_probe import FUSED
    return {"bare": parsed(BARE.format(t="f16"), "bare"),
            "bf16": parsed(BARE.format(t="bf16"), "bf16"), "fused": parsed(FUSED, "fused")}


RULE_SHAPES = {"bare": RULE, "bf16": SOME, "fused": SOME}


def warm_rule():
    """Compile the sized choice before and after at every shape of the rule's table."""
    from kgen import ir
    from kgen.lower import builder
    from kgen.targets import target
    from kgen.targets.sm90 import configs
    tgt, tiles = target(ir.Arch.SM90A), configs.SIZED_TILES
    for name, kernel in rule_kernels().items():
        chosen = []
        for after in (False, True):
            configs.SIZED_TILES = tiles if after else tuple(
                t for t in tiles if t[:2] not in configs.SIZED_NARROW)
            chosen += [builder.sized(kernel, tgt, dict(M=m, N=n, K=k))
                       for m, n, k in RULE_SHAPES[name]]
        configs.SIZED_TILES = tiles
        warm(kernel, chosen)


# 128x128 weighed at 1.11 (its cost at exact waves in probe.log: 1.108-1.116; after) against
# the product's 1.06 (before; tried and not kept, bench/RESULTS.md):
# shapes drawn (seed 4) among the 1.4% of 4000 random shapes (seed 43) whose choice changes, four
# of them where B's rows split 128-byte lines (the line rule's cluster before, 256x152 after);
# then three of the grid and my own 6400x2944x2560
COST128 = [(3480, 2848, 7936), (7264, 3784, 7040), (6376, 1536, 896), (3528, 4216, 1472),
           (5568, 4168, 2560), (2104, 4856, 3648), (5088, 4568, 1600),
           (5880, 2488, 4456), (4344, 3432, 7736), (5672, 2488, 3056), (6904, 2120, 7624),
           (4632, 6200, 1536), (5568, 4784, 8192), (7280, 1848, 6464), (6400, 2944, 2560)]


def cost128_table():
    from misaligned_probe import rounds_table
    from kgen.targets.sm90 import configs
    old = configs.SIZED_TILES
    tiles = tuple((m, n, s, 1.11) if (m, n) == (128, 128) else (m, n, s, c)
                  for m, n, s, c in old)
    kernels = rule_kernels()
    shapes = {"bare": COST128, "bf16": COST128[:4] + COST128[7:9],
              "fused": COST128[:4] + COST128[7:9]}
    from kgen import ir
    from kgen.lower import builder
    from kgen.targets import target
    for name, kernel in kernels.items():
        chosen = []
        for table in (old, tiles):
            configs.SIZED_TILES = table
            chosen += [builder.sized(kernel, target(ir.Arch.SM90A), dict(M=m, N=n, K=k))
                       for m, n, k in shapes[name]]
        configs.SIZED_TILES = old
        warm(kernel, chosen)

    def patch(after):
        configs.SIZED_TILES = tiles if after else old
    try:
        rounds_table(kernels, shapes, patch, "before: 128x128 weighed at 1.06")
    finally:
        configs.SIZED_TILES = old


# split-K on clusters: the sized choice (split-K where few tiles leave SMs idle) against the
# same on a cluster 2x1 (B shared) and 1x2 (A shared); cuBLAS runs 256x2048x16384 on 128x128
# split-K tiles on a cluster 2x1 (27.5 us + 3.2 us for its sum, H200)
SPLIT_CLUSTER = [(256, 2048, 16384), (512, 1024, 16384), (256, 4096, 8192), (384, 1536, 12288),
                 (640, 1280, 12288), (128, 4096, 8192), (256, 1024, 32768)]


def split_cluster_table():
    from kgen import ir
    from kgen.lower import builder
    from kgen.targets import target
    from kgen.targets.sm90.configs import clustered
    kernel = parsed(BARE.format(t="f16"), "bare")
    tgt = target(ir.Arch.SM90A)

    def with_cluster(cluster):
        def make(sizes):
            config = builder.sized(kernel, tgt, sizes)
            return None if config is None else clustered(config, cluster)
        return make
    variants = {"sized": None, "sized c2x1": with_cluster((2, 1)),
                "sized c1x2": with_cluster((1, 2))}
    warm(kernel, [make(dict(M=m, N=n, K=k)) for m, n, k in SPLIT_CLUSTER
                  for make in (lambda s: builder.sized(kernel, tgt, s), with_cluster((2, 1)),
                               with_cluster((1, 2)))])
    for _ in range(2):
        grid(kernel, SPLIT_CLUSTER, variants, width=11)
    for m, n, k in SPLIT_CLUSTER:
        config = builder.sized(kernel, tgt, dict(M=m, N=n, K=k))
        print(f"{m}x{n}x{k}: sized {config.label if config else 'default'}")


def profile_split():
    """Kernel device times (torch.profiler, warm) of kgen.load's choice and of torch.matmul at
    the split-K shapes: the main kernel and <kernel>_splitk apart."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kgen
    kernel = parsed(BARE.format(t="f16"), "bare")
    k = kgen.load(kernel, "sm_90a")
    for m, n, kk in [(256, 2048, 16384), (256, 1024, 32768), (640, 1280, 12288)]:
        a = torch.randn(m, kk, device="cuda").half()
        b = torch.randn(n, kk, device="cuda").half().t()
        chosen = k.variant(dict(M=m, N=n, K=kk)).plan.schedule.chosen
        print(f"{m}x{n}x{kk}: kgen runs " + ", ".join(f"{c.line} {c.value}" for c in chosen))
        for name, call in (("kgen", lambda: k(A=a, B=b)), ("torch", lambda: torch.matmul(a, b))):
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    call()
                torch.cuda.synchronize()
            times = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    times.setdefault(e.name, []).append(e.device_time)
            for kname, ts in times.items():
                ts = sorted(ts)
                print(f"  {name}: {len(ts)}x {ts[len(ts) // 2]:7.1f} us  {kname[:90]}", flush=True)


def rule_table():
    from kgen.targets.sm90 import configs
    warm_rule()
    tiles_table(RULE_SHAPES, configs.SIZED_NARROW)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", nargs="+", default=["cost", "grid"],
                        choices=("cost", "grid", "rule", "recheck", "cost128", "wide", "splitc",
                                 "profile"))
    args = parser.parse_args()
    kernel = parsed(BARE.format(t="f16"), "bare")
    if {"cost", "grid"} & set(args.part):
        from kgen.lower import builder
        from kgen.targets import target
        from kgen import ir
        tgt = target(ir.Arch.SM90A)
        sized = [builder.sized(kernel, tgt, dict(M=m, N=n, K=k)) for m, n, k in GRID]
        warm(kernel, [config(n, s) for n, s in COST_TILES] + sized
             + list(grid_variants().values()))
    if "cost" in args.part:
        cost_table(kernel)
    if "wide" in args.part:
        warm(kernel, [config(n, s, m) for m, n, s in COST_WIDE])
        cost_table(kernel, COST_WIDE)
    if "grid" in args.part:
        grid(kernel, GRID, grid_variants(), width=11)
    if "recheck" in args.part:
        for _ in range(2):
            grid(kernel, RECHECK, {"sized": None, "128x160 s4": config(160, 4),
                                   "128x176 s4": config(176, 4)}, width=11)
    if "rule" in args.part:
        rule_table()
    if "cost128" in args.part:
        cost128_table()
    if "splitc" in args.part:
        split_cluster_table()
    if "profile" in args.part:
        profile_split()
    return 0


if __name__ == "__main__":
    sys.exit(main())
