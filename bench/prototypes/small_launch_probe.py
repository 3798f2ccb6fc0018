"""The sweep's small launches (issue 17): 1024^3 and 128x4096x4096 trail torch.matmul by 3-5%,
and cuBLAS runs our tiles there on clusters (on an H100: 64x128 s8 on 2x1, 64x64 s13 on 1x2),
where ours on clusters lost 12-20% (bench/logs/tail_probe/tail_probe2.log). Where does the time
go? (bench/logs/small_launch/, bench/RESULTS.md)

    events   each variant, x torch.matmul (CUDA events around each launch, checked first)
    profile  the kernels alone (torch.profiler's device times: no launch gaps), kgen's and
             cuBLAS's, with each variant's grid (CTAs, clusters resident at once)
    ncu      one launch of each variant and of torch.matmul, for `ncu` to read
    overhead the sized choice and torch.matmul timed four ways: CUDA events around each launch
             with inputs rotated past L2 (the benchmarks' way) and without rotation, a CUDA
             graph of 20 launches (rotated), and the kernels alone (torch.profiler, warm)
    rings    deeper rings for the 64-row ping-pong tiles (cuBLAS runs 64x64 on 13 stages at
             128x4096x4096): 64x64 s12-14 and 64x128 s8-9, two rounds, x torch.matmul
    order    does going first cost? kgen and torch.matmul timed the benchmarks' way (events,
             rotated, 30 runs each) three times in turn, kgen first: K T K T K T

    bash .gpu/device-run.sh python3 bench/prototypes/small_launch_probe.py [--part events profile]
"""
import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from defaults import BARE  # noqa: E402
from wide_probe import grid, parsed  # noqa: E402

SHAPES = [(1024, 1024, 1024), (128, 4096, 4096), (2048, 2048, 2048), (256, 4096, 4096)]


def variants():
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig

    def pp(n, s, cluster=(1, 1)):
        return Config((GemmConfig((64, n, 64), (2, 4), s, cluster=cluster),), KernelKind.PINGPONG)

    def coop(m, n, s, cluster=(1, 1)):
        return Config((GemmConfig((m, n, 64), (2, 4), s, cluster=cluster),),
                      KernelKind.COOPERATIVE)
    return {"sized": None, "pp 64x128 s8": pp(128, 8), "pp 64x128 s8 c2x1": pp(128, 8, (2, 1)),
            "pp 64x64 s12": pp(64, 12), "pp 64x64 s12 c1x2": pp(64, 12, (1, 2)),
            "pp 64x64 s12 c2x1": pp(64, 12, (2, 1)),
            "co 128x64 s8": coop(128, 64, 8), "co 128x64 s8 c1x2": coop(128, 64, 8, (1, 2)),
            "co 128x256 s4": coop(128, 256, 4), "co 128x256 s4 c2x1": coop(128, 256, 4, (2, 1))}


def loaded(kernel, config, sizes):
    """The compiled kernel of `config` (None: the sized choice) and torch operands."""
    import torch

    from kgen.api import build, load_built
    from kgen.ir import Arch
    from kgen.lower import builder
    from kgen.targets import target

    if config is None:
        config = builder.sized(kernel, target(Arch.SM90A), sizes)
    compiled = load_built(build(kernel, Arch.SM90A, source_name="probe.kg", config=config))
    m, n, k = sizes["M"], sizes["N"], sizes["K"]
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16).t()  # [K, N] column-major
    d = torch.empty(m, n, device="cuda", dtype=torch.float16)
    return compiled, a, b, d


def device_us(run, names, count=20):
    """Median device time (us) per kernel name matching one of `names`, of `count` runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(count):
            run()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and any(n in e.name for n in names):
            times.setdefault(e.name[:60], []).append(e.device_time)
    return {name: statistics.median(ts) for name, ts in times.items()}


def profile_table(kernel):
    import torch

    for m, n, k in SHAPES:
        sizes = dict(M=m, N=n, K=k)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16).t()
        cublas = device_us(lambda: torch.matmul(a, b), ("nvjet", "gemm", "Kernel", "splitK"))
        print(f"{m}x{n}x{k}: cuBLAS " + "  ".join(f"{v:.2f} us {k}" for k, v in cublas.items()))
        for name, config in variants().items():
            try:
                compiled, a2, b2, d2 = loaded(kernel, config, sizes)
                times = device_us(lambda: compiled(A=a2, B=b2, D=d2), ("bare",))
            except Exception as exc:  # a refused variant: say why, go on
                print(f"  {name}: {type(exc).__name__}: {exc}"[:160])
                continue
            plan = compiled.plan
            ctas = (plan.cluster_grid(sizes, compiled.persistent_clusters)
                    if plan.schedule.cluster_size > 1 else plan.grid(sizes))
            us = " ".join(f"{v:.2f}" for v in times.values())
            print(f"  {name:<22} {us:>8} us  grid {ctas[0]} (clusters resident "
                  f"{compiled.persistent_clusters})", flush=True)


def ncu_launches(kernel, shapes, names):
    import torch

    for m, n, k in shapes:
        sizes = dict(M=m, N=n, K=k)
        for name, config in variants().items():
            if names and name not in names:
                continue
            try:
                compiled, a, b, d = loaded(kernel, config, sizes)
            except Exception:
                continue
            torch.cuda.nvtx.range_push(f"{m}x{n}x{k} {name}")
            compiled(A=a, B=b, D=d)
            torch.cuda.nvtx.range_pop()
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        torch.matmul(a, torch.randn(n, k, device="cuda", dtype=torch.float16).t())
        torch.cuda.synchronize()


def overhead_table(kernel):
    import torch

    from kgen.harness.timing import time_kernel
    from kgen.runtime.device import device_info

    l2 = device_info().l2_bytes
    stream = torch.cuda.current_stream().cuda_stream
    print("us per launch: events rotated | events warm | graph of 20 rotated | profiler warm")
    for m, n, k in SHAPES[:2] + [(4096, 4096, 4096)]:
        sizes = dict(M=m, N=n, K=k)
        compiled = loaded(kernel, None, sizes)[0]
        rotate, runs = rotated_runs(compiled, sizes, l2)
        for who, run in runs.items():
            cold = time_kernel(run, rotate=rotate, stream=stream).median_ms * 1e3
            warm = time_kernel(run, rotate=1, stream=stream).median_ms * 1e3
            run(0)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(20):
                    run(i % rotate)
            graphed = []
            for _ in range(10):
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                graphed.append(start.elapsed_time(end) * 1e3 / 20)
            alone = list(device_us(lambda: run(0), ("bare", "nvjet", "gemm")).values())
            print(f"{m}x{n}x{k} {who:<6} {cold:7.2f} {warm:7.2f} {statistics.median(graphed):7.2f} "
                  f"{' '.join(f'{t:.2f}' for t in alone)}  (rotate {rotate})", flush=True)


RING_SHAPES = [(128, 4096, 4096), (1024, 1024, 1024), (64, 8192, 4096), (256, 4096, 4096),
               (128, 8192, 2048), (320, 2048, 4096), (64, 4096, 8192), (192, 3072, 6144)]


def ring_variants():
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig
    return {f"64x{n} s{s}": Config((GemmConfig((64, n, 64), (2, 4), s),), KernelKind.PINGPONG)
            for n, s in ((64, 12), (64, 13), (64, 14), (128, 8), (128, 9))}


def rotated_runs(compiled, sizes, l2):
    """The sets of operands that rotate past L2 and a launch of each for kgen and torch."""
    import torch

    from kgen.harness.timing import rotation_count
    m, n, k = sizes["M"], sizes["N"], sizes["K"]
    rotate = rotation_count(2 * (m * k + k * n + m * n), l2)
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
             torch.randn(n, k, device="cuda", dtype=torch.float16).t(),
             torch.empty(m, n, device="cuda", dtype=torch.float16)) for _ in range(rotate)]
    return rotate, {"kgen": lambda i: compiled(A=sets[i][0], B=sets[i][1], D=sets[i][2]),
                    "torch": lambda i: torch.matmul(sets[i][0], sets[i][1], out=sets[i][2])}


def order_table(kernel):
    import torch

    from kgen.harness.timing import time_kernel
    from kgen.runtime.device import device_info

    l2 = device_info().l2_bytes
    stream = torch.cuda.current_stream().cuda_stream
    print("us per launch (events, rotated), in the order timed: K T K T K T; x matmul per pair")
    for m, n, k in SHAPES[:3] + [(3000, 5000, 2000), (4096, 4096, 4096)]:
        sizes = dict(M=m, N=n, K=k)
        compiled = loaded(kernel, None, sizes)[0]
        rotate, runs = rotated_runs(compiled, sizes, l2)
        times = []
        for _ in range(3):
            for who in ("kgen", "torch"):
                times.append(time_kernel(runs[who], rotate=rotate, stream=stream).median_ms * 1e3)
        pairs = [times[i + 1] / times[i] for i in range(0, 6, 2)]
        print(f"{m}x{n}x{k:<6} " + " ".join(f"{t:7.2f}" for t in times) + " | "
              + " ".join(f"{r:.3f}" for r in pairs), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", nargs="+", default=["events", "profile"])
    parser.add_argument("--variants", nargs="*", default=[], help="ncu: these variants only")
    parser.add_argument("--shape", nargs="*", default=[], help="ncu: MxNxK (default 2 shapes)")
    args = parser.parse_args()
    kernel = parsed(BARE.format(t="f16"), "bare")
    if "events" in args.part:
        grid(kernel, SHAPES, variants(), width=10)
    if "profile" in args.part:
        profile_table(kernel)
    if "overhead" in args.part:
        overhead_table(kernel)
    if "rings" in args.part:
        for _ in range(2):
            grid(kernel, RING_SHAPES, {"sized": None, **ring_variants()}, width=10)
    if "order" in args.part:
        order_table(kernel)
    if "ncu" in args.part:
        shapes = [tuple(map(int, s.split("x"))) for s in args.shape] or SHAPES[:2]
        ncu_launches(kernel, shapes, args.variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
