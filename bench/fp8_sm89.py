"""bench/fp8.py --sm89 (issue 53): sm_89's FP8 GEMM (examples/gemm_fp8_sm89.kg: mma.sync
m16n8k32 on e4m3, row-wise scales, bf16 out; the sm_80 mainloop) on an H100/H200, run as kgen's
runtime runs any kernel: NVRTC compiles the same source for the device's own arch (an sm_90a
cubin, not PTX for compute_89 JIT-compiled by the driver), so its FP8 mma.sync runs as Hopper's
SASS runs it, not as Ada's tensor cores would. Beside it: torch._scaled_mm row-wise with the same
scales, and kgen's own sm_90a row-wise kernel (wgmma, examples/gemm_fp8_rowwise.kg), timed alike
(CUDA events, the median, inputs rotated past L2). Each sm_89 kernel is first checked, output
poisoned, against the float64 product of the dequantized operands (256 rows). ptxas' spills of
the device build are printed: the sm_89 build of every listed tile has none
(tests/test_fp8_sm89.py).

    bash .gpu/device-run.sh python3 bench/fp8.py --sm89 [--shapes 4096x4096x4096,...] [--json F]
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK_ROWS = 256
# (label, tile, warps, stages) written beside the builder's: 32x32 warp tiles, which an sm_90a
# build compiles without spills, and a 64x64 one of the builder's list
VARIANTS = (("64x64x128 w2x2 s4", (64, 64, 128), (2, 2), 4),
            ("64x128x128 w2x2 s4", (64, 128, 128), (2, 2), 4),
            ("128x128x128 w2x2 s3", (128, 128, 128), (2, 2), 3))


def make_set(torch, m, n, k):
    """e4m3 operands of O(1) accumulators (A scaled by 1/sqrt(K) before the cast), row-wise
    scales (kgen's vectors, torch's [M, 1] and [1, N]) and kgen's output."""
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # [K, N], column-major
    sa = torch.rand(m, device="cuda") + 0.5
    sb = torch.rand(n, device="cuda") + 0.5
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return dict(A=a, B=b, D=d, sa=sa, sb=sb), (sa[:, None].contiguous(), sb[None, :].contiguous())


def scaled_mm(torch, s, scales):
    return torch._scaled_mm(s["A"], s["B"], scale_a=scales[0], scale_b=scales[1],
                            out_dtype=torch.bfloat16)


def check(torch, compiled, s, scales, stream):
    """(kgen's worst error relative to the reference's largest over CHECK_ROWS rows, the same
    for torch._scaled_mm); kgen's output poisoned first, every element must be written."""
    s["D"].fill_(float("nan"))
    compiled.launch(compiled.bind(**s), stream)
    torch.cuda.synchronize()
    assert not torch.isnan(s["D"]).any(), "kgen left output elements unwritten"
    rows = torch.randperm(s["A"].shape[0], device="cuda")[:CHECK_ROWS].sort().values
    ref = (s["A"][rows].double() @ s["B"].double()) * s["sa"][rows].double()[:, None] \
        * s["sb"].double()[None, :]
    norm = ref.abs().max().item()
    ours = (s["D"][rows].double() - ref).abs().max().item() / norm
    theirs = (scaled_mm(torch, s, scales)[rows].double() - ref).abs().max().item() / norm
    return ours, theirs


def sm89_rows(torch, shapes, stream, l2) -> list[dict]:
    from kgen import ir
    from kgen.api import build, build_file, load_built
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse_file
    from kgen.runtime.device import device_info
    from kgen.runtime.nvrtc import compile_cubin

    kernel = parse_file(ROOT / "examples" / "gemm_fp8_sm89.kg").kernels[0]
    built = {"sm_89 builder": build(kernel)}
    for label, tile, warps, stages in VARIANTS:
        g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*tile),
                                warps=ir.WarpGrid(*warps), stages=ir.StageCount(stages))
        built[f"sm_89 {label}"] = build(dataclasses.replace(kernel, gemms=(g,)))
    arch = device_info().arch
    for label, b in built.items():
        result = compile_cubin(b.source, b.plan.name, arch)
        g = b.plan.gemms[0]
        print(f"{label}: {'x'.join(map(str, g.tile))} w{g.warps[0]}x{g.warps[1]} s{g.stages}, "
              f"{b.plan.schedule.gemms[0].atom.instruction.value}; built for {arch}: spill "
              f"stores {result.spill_stores}, loads {result.spill_loads}", flush=True)
    compiled = {label: load_built(b) for label, b in built.items()}
    wgmma = load_built(build_file(ROOT / "examples" / "gemm_fp8_rowwise.kg"))
    rows = []
    for m, n, k in shapes:
        flops = 2 * m * n * k
        count = rotation_count(m * k + n * k + 2 * m * n, l2)
        sets = [make_set(torch, m, n, k) for _ in range(count)]

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=count, stream=stream).median_ms

        base = timed(lambda i: scaled_mm(torch, *sets[i % count]))
        wgmma_args = [wgmma.bind(**s) for s, _ in sets]
        t_wgmma = timed(lambda i: wgmma.launch(wgmma_args[i % count], stream))
        print(f"\nrow-wise {m}x{n}x{k}: torch._scaled_mm {base:.4f} ms "
              f"({flops / base / 1e9:.0f} TFLOP/s); kgen sm_90a wgmma {t_wgmma:.4f} ms "
              f"({flops / t_wgmma / 1e9:.0f} TFLOP/s)", flush=True)
        for label, own in compiled.items():
            ours, theirs = check(torch, own, *sets[0], stream)
            args = [own.bind(**s) for s, _ in sets]
            t = timed(lambda i: own.launch(args[i % count], stream))
            row = dict(figure="sm89", variant=label, shape=[m, n, k], ms=t,
                       tflops=flops / t / 1e9, torch_ms=base, vs_torch=base / t,
                       wgmma_ms=t_wgmma, vs_wgmma=t_wgmma / t, rel_err=ours,
                       torch_rel_err=theirs, built_for=arch)
            rows.append(row)
            print(f"  {label:28s} {t:.4f} ms {row['tflops']:5.0f} TFLOP/s "
                  f"{row['vs_torch']:.3f}x torch._scaled_mm, {row['vs_wgmma']:.3f}x kgen's "
                  f"wgmma kernel; err {ours:.1e} (torch {theirs:.1e})", flush=True)
    return rows
