"""Back-to-back GEMM (issue 5) on the GPU, in one process, at CUTLASS example 13's shapes:

    kgen: examples/b2b_gemm_rf.kg (one fused kernel; checked against the reference first)
    PyTorch: relu(relu(A @ B0 * scale0 + bias0) @ B1), f16 throughout (cuBLAS + elementwise)
    copy: a device-to-device copy, for the bandwidth of the bytes floor
    floor: A read once + D1 written once, at that copy bandwidth

Also times the other b2b examples and a few tile/stage variants of the register example (built
from its IR), so the figures say which configuration is best. Run on the GPU machine:
    bash .gpu/device-run.sh python3 bench/b2b_bench.py [--json OUT.json]
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

M, K0, N0, N1 = 81920, 576, 64, 128


def time_ms(fn, iters=50, warmup=10):
    """Median GPU time of fn() with CUDA events around each call (torch's current stream)."""
    import torch

    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """Bytes per ms of a 1 GiB device-to-device copy (read + write)."""
    import torch

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), iters=20, warmup=3)
    return 2 * n / ms


def torch_chain_ms() -> float:
    import torch

    sets = []
    for _ in range(4):  # rotate past L2 (each set is ~115 MB)
        a = torch.randn(M, K0, device="cuda").half()
        b0 = torch.randn(N0, K0, device="cuda").half().t()
        b1 = torch.randn(N1, N0, device="cuda").half().t()
        s0 = torch.rand(N0, device="cuda").half()
        c0 = torch.rand(N0, device="cuda").half()
        sets.append((a, b0, b1, s0, c0))
    i = [0]

    def chain():
        a, b0, b1, s0, c0 = sets[i[0] % len(sets)]
        i[0] += 1
        return torch.relu(torch.relu(a @ b0 * s0 + c0) @ b1)

    return time_ms(chain)


def kgen_ms(kernel, label, m=M, min_blocks=None, persistent=None):
    """Check, then time; `min_blocks` rewrites __launch_bounds__'s second argument (an
    experiment: it caps registers so that more CTAs fit on an SM); `persistent=False` lowers
    to the plain grid (one CTA per tile) instead of kgen's choice."""
    import dataclasses as dc

    from kgen.api import Built
    from kgen.emit import emit
    from kgen.lower import lower
    from kgen.runtime.run import run

    plan = lower(kernel, persistent=persistent)
    source = emit(plan, source_name=f"{label}.kg", source_hash="", command="bench")
    built = Built(kernel, plan, source)
    if min_blocks is not None:
        threads = built.plan.threads
        source = built.source.replace(f"__launch_bounds__({threads}, 1)",
                                      f"__launch_bounds__({threads}, {min_blocks})")
        built = dc.replace(built, source=source)
    report = run(built.kernel, built.plan, built.source, {"M": m}, check=True, bench=True,
                 compare_torch=False, iters=50)
    res = report.compile or {}
    return dict(label=label, ok=report.ok, ms=report.timing.median_ms, persistent=plan.persistent,
                registers=res.get("registers"), spills=res.get("spill_stores"),
                smem=built.plan.smem_bytes, bytes=report.bytes)


def variants(kernel):
    """The register example with other tiles and stages (same chain, same epilogues)."""
    from kgen import ir

    def with_(tile_m, warps_m, s0, s1):
        g0, g1 = kernel.gemms
        g0 = dataclasses.replace(g0, tile=dataclasses.replace(g0.tile, m=tile_m),
                                 warps=ir.WarpGrid(warps_m, 1), stages=ir.StageCount(s0))
        g1 = dataclasses.replace(g1, tile=dataclasses.replace(g1.tile, m=tile_m),
                                 warps=ir.WarpGrid(warps_m, 1), stages=ir.StageCount(s1))
        return dataclasses.replace(kernel, gemms=(g0, g1))

    for tile_m, warps_m, s0, s1, blocks in [(128, 4, 3, 3, None), (128, 4, 6, 2, None),
                                            (128, 4, 4, 3, 3), (128, 4, 6, 2, 3),
                                            (64, 4, 6, 2, None), (64, 4, 4, 2, 3),
                                            (64, 4, 8, 2, 3), (64, 2, 4, 2, None)]:
        label = f"rf tile M {tile_m} warps {warps_m}x1 stages {s0}/{s1}"
        if blocks:
            label += f" minblocks {blocks}"
        yield label, with_(tile_m, warps_m, s0, s1), blocks


def main() -> None:
    import torch

    from kgen.api import read_module

    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "shape": dict(M=M, K0=K0, N0=N0, N1=N1)}
    bw = copy_bandwidth()
    floor_bytes = (M * K0 + M * N1) * 2
    floor_ms = floor_bytes / bw
    chain_ms = torch_chain_ms()
    print(f"device {out['device']}, torch {out['torch']}")
    print(f"copy bandwidth {bw / 1e9:.3f} TB/s (read + write); bytes floor "
          f"{floor_bytes / 1e6:.1f} MB -> {floor_ms:.4f} ms")
    print(f"PyTorch chain relu(relu(A@B0*scale0+bias0)@B1), f16: {chain_ms:.4f} ms")
    rows = []
    for path in sorted((ROOT / "examples").glob("b2b*.kg")):
        module, _ = read_module(path)
        rows.append(kgen_ms(module.kernels[0], path.stem + (" persistent" if "rf" in path.stem
                                                             else "")))
        if path.stem == "b2b_gemm_rf":
            rows.append(kgen_ms(module.kernels[0], "b2b_gemm_rf non-persistent",
                                persistent=False))
            for label, kernel, blocks in variants(module.kernels[0]):
                try:
                    rows.append(kgen_ms(kernel, label, min_blocks=blocks))
                except Exception as err:  # a variant the lowering refuses is reported, not fatal
                    rows.append(dict(label=label, error=f"{type(err).__name__}: {err}"))
    print(f"{'kernel':<44} {'ok':>4} {'ms':>8} {'/floor':>7} {'vs torch':>9} {'regs':>5} "
          f"{'smem':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['label']:<44} {r['error']}")
            continue
        floor = r["bytes"] / bw  # this kernel's own inputs + outputs, once
        r.update(floor_ms=floor, floor_ratio=r["ms"] / floor, speedup=chain_ms / r["ms"])
        print(f"{r['label']:<44} {str(r['ok']):>4} {r['ms']:8.4f} {r['floor_ratio']:7.3f} "
              f"{r['speedup']:8.2f}x {r['registers']!s:>5} {r['smem']:>7}")
    out.update(copy_tbps=bw / 1e9, floor_ms=floor_ms, torch_chain_ms=chain_ms, kernels=rows)
    if "--json" in sys.argv:
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
