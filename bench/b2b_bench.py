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


HOLD = True  # --no-hold: time without holding the stream first (host launch gaps included)


def time_ms(fn, iters=50, warmup=10):
    """Median GPU time of fn() with CUDA events around each call (torch's current stream), by
    kgen's timer: the same method as the kgen kernels' figures (the stream is held while the
    runs are enqueued, see kgen/runtime/bench.py)."""
    import torch

    from kgen.harness.timing import time_kernel

    stream = int(torch.cuda.current_stream().cuda_stream)
    return time_kernel(lambda i: fn(), warmup=warmup, iters=iters, stream=stream,
                       hold=HOLD).median_ms


def copy_bandwidth() -> float:
    """Bytes per ms of a 1 GiB device-to-device copy (read + write)."""
    total = 2 << 30
    return total / copy_ms(total, sets=1)


def copy_ms(total_bytes: int, sets: int = 4) -> float:
    """A device-to-device copy moving `total_bytes` (half read, half written), rotated over
    `sets` buffer pairs (past L2 for copies smaller than it)."""
    import torch

    n = total_bytes // 2
    pairs = [(torch.empty(n, dtype=torch.uint8, device="cuda"),
              torch.empty(n, dtype=torch.uint8, device="cuda")) for _ in range(sets)]
    i = [0]

    def copy():
        src, dst = pairs[i[0] % len(pairs)]
        i[0] += 1
        dst.copy_(src)

    return time_ms(copy)


def torch_chain_ms(dtype=None, m=M, k0=K0, n0=N0, n1=N1) -> float:
    """The PyTorch chain in the operand dtype throughout (f16 by default), inputs rotated past
    L2 (each set of the example's shapes is ~115 MB)."""
    import torch

    dtype = dtype or torch.float16
    sets = []
    for _ in range(4):
        a = torch.randn(m, k0, device="cuda").to(dtype)
        b0 = torch.randn(n0, k0, device="cuda").to(dtype).t()
        b1 = torch.randn(n1, n0, device="cuda").to(dtype).t()
        s0 = torch.rand(n0, device="cuda").to(dtype)
        c0 = torch.rand(n0, device="cuda").to(dtype)
        sets.append((a, b0, b1, s0, c0))
    i = [0]

    def chain():
        a, b0, b1, s0, c0 = sets[i[0] % len(sets)]
        i[0] += 1
        return torch.relu(torch.relu(a @ b0 * s0 + c0) @ b1)

    return time_ms(chain)


def kgen_ms(kernel, label, m=M, min_blocks=None, persistent=None, arch=None):
    """Check, then time; `min_blocks` rewrites __launch_bounds__'s second argument (an
    experiment: it caps registers so that more CTAs fit on an SM); `persistent=False` lowers
    to the plain grid (one CTA per tile) instead of kgen's choice."""
    import dataclasses as dc

    from kgen.api import Built
    from kgen.emit import emit
    from kgen.lower import lower
    from kgen.harness.run import run

    plan = lower(kernel, arch, persistent=persistent)
    source = emit(plan, source_name=f"{label}.kg", source_hash="", command="bench")
    built = Built(kernel, plan, source)
    if min_blocks is not None:
        threads = built.plan.schedule.warps.threads
        source = built.source.replace(f"__launch_bounds__({threads}, 1)",
                                      f"__launch_bounds__({threads}, {min_blocks})")
        built = dc.replace(built, source=source)
    report = run(built.kernel, built.plan, built.source, {"M": m}, check=True, bench=True,
                 compare_torch=False, iters=50, hold=HOLD)
    res = report.compile or {}
    return dict(label=label, ok=report.ok, ms=report.timing.median_ms,
                persistent=plan.schedule.scheduler.persistent,
                registers=res.get("registers"), spills=res.get("spill_stores"),
                smem=built.plan.smem_bytes, bytes=report.bytes)


def variants(kernel):
    """The register example with other settings (same chain, same epilogues): yields
    (label, kernel, min_blocks, arch)."""
    from kgen import ir

    def with_(warps_m, s0, k0=64, resident=True):
        g0, g1 = kernel.gemms
        g0 = dataclasses.replace(g0, tile=dataclasses.replace(g0.tile, k=k0),
                                 warps=ir.WarpGrid(warps_m, 1), stages=ir.StageCount(s0),
                                 resident=resident)
        g1 = dataclasses.replace(g1, warps=ir.WarpGrid(warps_m, 1), resident=resident)
        return dataclasses.replace(kernel, gemms=(g0, g1))

    yield "rf B streamed (before keep B resident): 4 warps, 128x64x32, stages 4", \
        with_(4, 4, 32, resident=False), None, None
    yield "rf resident, 4 warps, stages 4", with_(4, 4), None, None
    yield "rf resident, 8 warps, stages 6 (sm_90a budget)", with_(8, 6), None, ir.Arch.SM90A


def main() -> None:
    import torch

    from kgen.api import read_module

    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "shape": dict(M=M, K0=K0, N0=N0, N1=N1)}
    global HOLD
    HOLD = "--no-hold" not in sys.argv
    bw = copy_bandwidth()
    floor_bytes = (M * K0 + M * N1) * 2
    floor_ms = floor_bytes / bw
    same_size_copy_ms = copy_ms(floor_bytes)
    chain_ms = torch_chain_ms()
    print(f"device {out['device']}, torch {out['torch']}")
    print(f"copy bandwidth {bw / 1e9:.3f} TB/s (read + write); bytes floor "
          f"{floor_bytes / 1e6:.1f} MB -> {floor_ms:.4f} ms")
    print(f"PyTorch chain relu(relu(A@B0*scale0+bias0)@B1), f16: {chain_ms:.4f} ms")
    print(f"a copy of the same {floor_bytes / 1e6:.1f} MB (read + write): {same_size_copy_ms:.4f} ms"
          f" ({floor_bytes / same_size_copy_ms / 1e9:.3f} TB/s); timing with hold={HOLD}")
    rows = []
    for path in sorted((ROOT / "examples").glob("b2b*.kg")):
        module, _ = read_module(path)
        rows.append(kgen_ms(module.kernels[0], path.stem))
        if path.stem == "b2b_gemm_rf":
            for label, kernel, blocks, arch in variants(module.kernels[0]):
                try:
                    rows.append(kgen_ms(kernel, label, min_blocks=blocks, arch=arch))
                except Exception as err:  # a variant the lowering refuses is reported, not fatal
                    rows.append(dict(label=label, error=f"{type(err).__name__}: {err}"))
    print(f"{'kernel':<72} {'ok':>4} {'ms':>8} {'/floor':>7} {'vs torch':>9} {'regs':>5} "
          f"{'smem':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['label']:<72} {r['error']}")
            continue
        floor = r["bytes"] / bw  # this kernel's own inputs + outputs, once
        r.update(floor_ms=floor, floor_ratio=r["ms"] / floor, speedup=chain_ms / r["ms"])
        print(f"{r['label']:<72} {str(r['ok']):>4} {r['ms']:8.4f} {r['floor_ratio']:7.3f} "
              f"{r['speedup']:8.2f}x {r['registers']!s:>5} {r['smem']:>7}")
    out.update(copy_tbps=bw / 1e9, floor_ms=floor_ms, torch_chain_ms=chain_ms, kernels=rows,
               same_size_copy_ms=same_size_copy_ms, hold=HOLD)
    if "--json" in sys.argv:
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
