"""Issue 53 on an H100/H200, in one process: kgen's FP8 GEMM (e4m3 A [M, K] row-major, e4m3 B
[K, N] column-major, bf16 out; the warp-specialized sm_90a kernel on wgmma m64nNk32) beside
torch._scaled_mm with the same scales, tensor-wise (two scalars) and row-wise (a scale per row of
A and per column of B), both timed the same way (CUDA events around each run, the median,
inputs rotated past L2). Each kgen kernel is first checked against a float64 reference of the
dequantized operands (256 rows) and against torch._scaled_mm, on the timing's own inputs.

    bash .gpu/device-run.sh python3 bench/fp8.py [--json OUT.json] [--quick] [--llama]
        [--variants] [--shapes 4096x4096x4096,...] [--blockwise] [--fp8-out]

--blockwise (bench/fp8_blocks.py): examples/gemm_fp8_blockwise.kg (1x128 A scales, 128x128 B
scales) beside kgen's tensor-wise kernel and torch's block-wise scaled_mm, at 8192^3 (with
--llama the Llama-class shapes too).
--fp8-out (bench/fp8_out.py): examples/gemm_fp8_out_amax.kg (row-scaled e4m3 output, saturated,
and amax) beside the bare kernel, at the Llama-class shapes.

The kernels are examples/gemm_fp8_tensorwise.kg and examples/gemm_fp8_rowwise.kg as they are
(the builder's schedule), plus, with --variants, a few written schedules of the same kernel: the
128x128 cooperative one promotes wgmma's sums into f32 registers every k tile (two-level
accumulation), the others accumulate the whole K in wgmma, as use_fast_accum=True does; the
torch baselines are timed both ways (use_fast_accum False, torch's default, and True).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK_TFLOPS = 1979.0  # dense FP8 on an H100/H200 SXM
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 14336, 4096))
# issue 53's Llama-class set (--llama): M 2048 and 8192 by the weights 4096x4096, 14336x4096 and
# 4096x14336 (N x K)
LLAMA = tuple((m, n, k) for m in (2048, 8192) for n, k in ((4096, 4096), (14336, 4096),
                                                            (4096, 14336)))
CHECK_ROWS = 256
BLOCK_SHAPE = (8192, 8192, 8192)  # --blockwise's shape unless --shapes or --llama
EXAMPLES = {"tensor-wise": "gemm_fp8_tensorwise.kg", "row-wise": "gemm_fp8_rowwise.kg"}
# Written schedules measured beside the builder's with --variants: (label, tile, stages, kind)
VARIANTS = (("cooperative 128x256x128 s4", (128, 256, 128), 4, None),
            ("cooperative 128x256x128 s3", (128, 256, 128), 3, None),
            ("cooperative 128x128x128 s6 (promoted)", (128, 128, 128), 6, None),
            ("pingpong 128x128x128 s5", (128, 128, 128), 5, "pingpong"))


def make_set(torch, m, n, k, scaling):
    """One input set: FP8 operands of O(1) accumulators (A scaled by 1/sqrt(K) before the
    cast), their scales, and kgen's output."""
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # [K, N], column-major
    if scaling == "tensor-wise":
        sa, sb = 0.75, 1.25  # kgen takes scalars by value; torch wants device tensors
        scales = dict(sa=sa, sb=sb)
        torch_scales = (torch.tensor(sa, device="cuda"), torch.tensor(sb, device="cuda"))
    else:
        sa = torch.rand(m, device="cuda") + 0.5
        sb = torch.rand(n, device="cuda") + 0.5
        scales = dict(sa=sa, sb=sb)
        torch_scales = (sa[:, None].contiguous(), sb[None, :].contiguous())
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return dict(A=a, B=b, D=d, **scales), torch_scales


def torch_fp8(torch, s, scales, fast_accum=False):
    return torch._scaled_mm(s["A"], s["B"], scale_a=scales[0], scale_b=scales[1],
                            out_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def reference_rows(torch, s, rows):
    """The float64 product of the dequantized operands times the scales, for `rows`."""
    a = s["A"][rows].double()
    out = a @ s["B"].double()
    sa, sb = s["sa"], s["sb"]
    if isinstance(sa, float):
        return out * sa * sb
    return out * sa[rows].double()[:, None] * sb.double()[None, :]


def check(torch, compiled, s, scales, stream):
    """(kgen's worst relative error against the float64 reference over CHECK_ROWS rows, the
    same for torch._scaled_mm); kgen's output poisoned first."""
    s["D"].fill_(float("nan"))
    compiled.launch(compiled.bind(**s), stream)
    torch.cuda.synchronize()
    assert not torch.isnan(s["D"]).any(), "kgen left output elements unwritten"
    m = s["A"].shape[0]
    rows = torch.randperm(m, device="cuda")[:CHECK_ROWS].sort().values
    ref = reference_rows(torch, s, rows)
    norm = ref.abs().max().item()
    ours = (s["D"][rows].double() - ref).abs().max().item() / norm
    theirs = (torch_fp8(torch, s, scales)[rows].double() - ref).abs().max().item() / norm
    return ours, theirs


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import build, load_built
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse_file

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="the first shape only")
    parser.add_argument("--variants", action="store_true", help="written schedules too")
    parser.add_argument("--shapes", default=None, help="MxNxK,... instead of the issue's")
    parser.add_argument("--llama", action="store_true", help="the Llama-class shapes too")
    parser.add_argument("--blockwise", action="store_true",
                        help="block scales (1x128 A, 128x128 B) beside kgen's tensor-wise kernel "
                        "and torch's block-wise scaled_mm, instead of the tables above")
    parser.add_argument("--fp8-out", action="store_true",
                        help="the row-scaled FP8-out epilogue with amax beside the bare kernel, "
                        "at the Llama-class shapes (--quick: 4096^3 only)")
    opts = parser.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print("device", props.name, "torch", torch.__version__, "kgen", kgen.__version__)
    stream = torch.cuda.current_stream().cuda_stream
    l2 = props.L2_cache_size
    shapes = ([tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",")]
              if opts.shapes else list(SHAPES))
    if opts.llama:
        shapes += [s for s in LLAMA if s not in shapes]
    if opts.quick:
        shapes = shapes[:1]
    if opts.fp8_out:
        from fp8_out import fp8_out_rows  # bench/fp8_out.py

        chosen = shapes if opts.shapes else list(LLAMA)
        rows = fp8_out_rows(torch, [SHAPES[0]] if opts.quick else chosen, stream, l2)
        if opts.json:
            Path(opts.json).write_text(json.dumps(rows, indent=1))
        return 0
    if opts.blockwise:
        from fp8_blocks import blockwise_rows  # bench/fp8_blocks.py

        chosen = shapes if opts.shapes else [BLOCK_SHAPE] + (list(LLAMA) if opts.llama else [])
        rows = blockwise_rows(torch, chosen[:1] if opts.quick else chosen, stream, l2,
                              variants=opts.variants)
        if opts.json:
            Path(opts.json).write_text(json.dumps(rows, indent=1))
        return 0
    rows = []
    for scaling, example in EXAMPLES.items():
        kernel = parse_file(ROOT / "examples" / example).kernels[0]
        kernels = [("builder", kernel)]
        if opts.variants:
            g = kernel.gemms[0]
            for label, tile, stages, kind in VARIANTS:
                gemm = dataclasses.replace(g, tile=ir.TileShape(*tile), warps=ir.WarpGrid(2, 4),
                                           stages=ir.StageCount(stages))
                kernels.append((label, dataclasses.replace(
                    kernel, gemms=(gemm,), schedule=ir.Schedule.from_name(kind) if kind else None)))
        for m, n, k in shapes:
            flops = 2 * m * n * k
            set_bytes = m * k + n * k + 2 * m * n
            count = rotation_count(set_bytes, l2)
            sets = [make_set(torch, m, n, k, scaling) for _ in range(count)]

            def timed(fn):
                return time_kernel(fn, iters=30, warmup=5, rotate=count, stream=stream).median_ms

            base = timed(lambda i: torch_fp8(torch, *sets[i % count]))
            fast = timed(lambda i: torch_fp8(torch, *sets[i % count], fast_accum=True))
            print(f"\n{scaling} {m}x{n}x{k}: torch._scaled_mm {base:.4f} ms "
                  f"({flops / base / 1e9:.0f} TFLOP/s), use_fast_accum {fast:.4f} ms "
                  f"({flops / fast / 1e9:.0f} TFLOP/s)")
            for label, variant in kernels:
                try:
                    built = build(variant)
                    started = time.perf_counter()
                    compiled = load_built(built)
                    compile_s = time.perf_counter() - started
                except Exception as err:  # a refused variant is a result too
                    print(f"  {label:28s} not built: {str(err).splitlines()[0][:140]}")
                    continue
                ours, theirs = check(torch, compiled, *sets[0], stream)
                bound = [compiled.bind(**s) for s, _ in sets]
                t = timed(lambda i: compiled.launch(bound[i % count], stream))
                g = built.plan.gemms[0]
                kind = built.plan.schedule.scheduler.kind.value
                promoted = built.plan.schedule.gemms[0].promotion.k_tiles > 0
                row = dict(scaling=scaling, variant=label, shape=[m, n, k], ms=t,
                           tflops=flops / t / 1e9, torch_ms=base, torch_tflops=flops / base / 1e9,
                           torch_fast_ms=fast, vs_torch=base / t, vs_torch_fast=fast / t,
                           rel_err=ours, torch_rel_err=theirs, promoted=promoted,
                           tile=list(g.tile), stages=g.stages, kind=kind, compile_s=compile_s)
                rows.append(row)
                print(f"  {label:28s} {t:.4f} ms {row['tflops']:5.0f} TFLOP/s "
                      f"({100 * row['tflops'] / PEAK_TFLOPS:.0f}% of FP8 peak) "
                      f"{row['vs_torch']:.3f}x torch._scaled_mm ({row['vs_torch_fast']:.3f}x "
                      f"fast accum); err {ours:.1e} "
                      f"(torch {theirs:.1e}); {kind} {'x'.join(map(str, g.tile))} s{g.stages}"
                      f"{', promoted' if promoted else ''}; "
                      f"compile {compile_s:.2f} s")
    for scaling in EXAMPLES:
        ratios = [r["vs_torch"] for r in rows if r["scaling"] == scaling
                  and r["variant"] == "builder"]
        if ratios:
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            print(f"{scaling}: geometric mean {geo:.3f}x torch._scaled_mm (builder's schedule), "
                  f"lowest {min(ratios):.3f}x")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
