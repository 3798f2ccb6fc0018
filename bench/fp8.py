"""Issue 53 on an H100/H200, in one process: kgen's FP8 GEMM (e4m3 A [M, K] row-major, e4m3 B
[K, N] column-major, bf16 out; the warp-specialized sm_90a kernel on wgmma m64nNk32) beside
torch._scaled_mm with the same scales, tensor-wise (two scalars) and row-wise (a scale per row of
A and per column of B), both timed the same way (CUDA events around each run, the median,
inputs rotated past L2). Each kgen kernel is first checked against a float64 reference of the
dequantized operands (256 rows) and against torch._scaled_mm, on the timing's own inputs.

    bash .gpu/device-run.sh python3 bench/fp8.py [--json OUT.json] [--quick] [--llama]
        [--variants] [--shapes 4096x4096x4096,...] [--blockwise [--overlap] [--sets] [--loads]]
        [--fp8-out] [--sm89]

--blockwise: examples/gemm_fp8_blockwise.kg (1x128 A scales, 128x128 B
scales) beside kgen's tensor-wise kernel and torch's block-wise scaled_mm, at 8192^3 (with
--llama the Llama-class shapes too); --overlap (or --variants) adds the promotion overlap's plan
options (the consumers' turns, the early slot release: OVERLAP_VARIANTS); --sets (or --variants)
the period sets (a group in flight while the one before is promoted), tile N 144 and 160
(SETS_VARIANTS) and two timing bounds: the builder's kernel without its promotion, and the
tensor-wise kernel on the same tile; --loads (or --sets, --variants) the scale loads' plan option
(the producer warp's copies into each slot's buffer, beside the rulebook's consumer __ldg:
LOADS_VARIANT)
and the bound without the mainloop's scale loads.
--sm89: examples/gemm_fp8_sm89.kg (sm_89's mma.sync m16n8k32, the same source built for this
device's arch) beside torch._scaled_mm and kgen's wgmma kernel, row-wise, at 4096^3 and 8192^3.
--fp8-out: examples/gemm_fp8_out_amax.kg (row-scaled e4m3 output, saturated,
and amax) beside the bare kernel and the same kernel without amax (the reduction's cost), at the
Llama-class shapes.

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


# ---------------------------------------------------------------------------------------------
# bench/fp8.py --blockwise (issue 53): kgen's FP8 GEMM with block scales
# (examples/gemm_fp8_blockwise.kg: A's 1x128, B's 128x128, DeepGEMM's recipe) beside kgen's
# tensor-wise kernel (examples/gemm_fp8_tensorwise.kg) on the same operands and torch's block-wise
# scaled_mm where this torch has it, timed alike (CUDA events, the median, inputs rotated past
# L2). Each kgen kernel is first checked, output poisoned, against the float64 product of the
# dequantized operands over 256 rows.


def block_set(torch, m, n, k):
    """FP8 operands of O(1) accumulators, their block scales (SA [M, K / 128] M-contiguous,
    SB [N / 128, K / 128]) and two outputs."""
    kb, nb = -(-k // 128), -(-n // 128)
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # [K, N] column-major
    sa = (torch.rand(kb, m, device="cuda") + 0.5).t()
    sb = torch.rand(nb, kb, device="cuda") + 0.5
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return dict(A=a, B=b, SA=sa, SB=sb, D=d)


def torch_blockwise(torch, s):
    """torch's block-wise product of the set and the call that made it, or None and why torch
    has none here."""
    import torch.nn.functional as F

    whys = []
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        try:
            return F.scaled_mm(s["A"], s["B"], s["SA"], F.ScalingType.BlockWise1x128,
                               s["SB"].t(), F.ScalingType.BlockWise128x128,
                               output_dtype=torch.bfloat16), "torch.nn.functional.scaled_mm"
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
            whys.append(f"F.scaled_mm: {str(error).splitlines()[0][:160]}")
    else:
        whys.append("no torch.nn.functional.scaled_mm")
    try:
        return torch._scaled_mm(s["A"], s["B"], scale_a=s["SA"], scale_b=s["SB"].t(),
                                out_dtype=torch.bfloat16), "torch._scaled_mm"
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
        whys.append(f"torch._scaled_mm: {str(error).splitlines()[0][:160]}")
    return None, "; ".join(whys)


def block_reference(torch, s, rows):
    """The float64 product of the dequantized operands for `rows`."""
    k = s["A"].shape[1]
    n = s["B"].shape[1]
    a = s["A"][rows].double() * s["SA"][rows].double().repeat_interleave(128, dim=1)[:, :k]
    block = s["SB"].double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    return a @ (s["B"].double() * block[:n, :k].t())


def block_error(torch, out, s, rows):
    ref = block_reference(torch, s, rows)
    return (out[rows].double() - ref).abs().max().item() / ref.abs().max().item()


# Written schedules of the block-wise kernel timed with --variants: (label, kind, tile, stages)
BLOCK_VARIANTS = (("cooperative 128x128x128 s6", None, (128, 128, 128), 6, None),
            ("cooperative 128x128x128 s5", None, (128, 128, 128), 5, None),
            ("cooperative 128x192x128 s4 cluster 2x1", None, (128, 192, 128), 4, (2, 1)),
            ("cooperative 128x192x128 s4 cluster 1x2", None, (128, 192, 128), 4, (1, 2)),
            ("cooperative 128x128x128 s6 cluster 2x1", None, (128, 128, 128), 6, (2, 1)),
            ("cooperative 128x128x128 s6 cluster 1x2", None, (128, 128, 128), 6, (1, 2)),
            ("pingpong 64x128x128 s8", "pingpong", (64, 128, 128), 8, None))


# The promotion overlap's plan options (warp_specialized.with_promotion_overlap), timed with
# --variants beside the rulebook's plan: (label, written schedule or None for the builder's,
# turns, early release)
OVERLAP_VARIANTS = (
    ("builder + turns", None, True, False),
    ("builder + early release", None, False, True),
    ("builder + turns + early release", None, True, True),
    ("cooperative 128x128x128 s6 + turns + early release", (None, (128, 128, 128), 6), True,
     True),
)


def overlap_variant(kernel, schedule, turns, early):
    """The block-wise kernel (on a written schedule, or the builder's) built with its promotion
    overlap set: the plan option, re-emitted."""
    from kgen.targets.sm90.promotion import with_promotion_overlap

    return replanned(kernel, schedule, lambda plan: with_promotion_overlap(plan, turns, early))


# Where the sums wait for their promotion (PeriodSets, promotion.with_period_sets) and the
# tile widths DeepGEMM picks, timed with --sets (and --variants) beside the rulebook's plan:
# (label, written schedule (kind, tile, stages) or None for the builder's, period sets)
SETS_VARIANTS = (
    ("builder + halves", None, "halves"),
    ("cooperative 128x192x128 s4 cluster 2x1", (None, (128, 192, 128), 4, (2, 1)), "one"),
    ("cooperative 128x192x128 s4 cluster 2x1 + halves", (None, (128, 192, 128), 4, (2, 1)),
     "halves"),
    ("cooperative 128x128x128 s6 + halves", (None, (128, 128, 128), 6), "halves"),
    ("cooperative 128x128x128 s5 + halves", (None, (128, 128, 128), 5), "halves"),
    ("cooperative 128x160x128 s4 + halves", (None, (128, 160, 128), 4), "halves"),
    ("cooperative 128x144x128 s5 + halves", (None, (128, 144, 128), 5), "halves"),
)
# Timing bounds (--sets; wrong results, not checked): the builder's block-scaled kernel with the
# promotion and scales left out (promotion.without_promotion: each k tile still waited) or with
# the mainloop's scale loads left out, and the tensor-wise kernel on the block-scaled tile (no
# promotion: one group kept in flight)
BOUND_BLOCK = "bound: builder without promotion (k tiles waited)"
BOUND_LOADS = "bound: builder without the mainloop's scale loads"
BOUND_TENSOR = "bound: tensor-wise on the builder's tile (no promotion)"


# Who loads each k tile's scales (ScaleLoads, promotion.with_scale_loads), timed with --loads
# (and --sets, --variants) beside the rulebook's plan (the consumers' __ldg): the builder's with
# the producer warp's copies into each ring slot's scale buffer
LOADS_VARIANT = "builder, producer's scale copies"


def loads_variant(kernel):
    """The builder's block-wise kernel with the producer's scale copies: the plan option."""
    from kgen.plan import ScaleLoads
    from kgen.targets.sm90.promotion import with_scale_loads

    return replanned(kernel, None, lambda plan: with_scale_loads(plan, ScaleLoads.PRODUCER))


def sets_variant(kernel, schedule, sets):
    """The block-wise kernel (on a written schedule, or the builder's) with its period sets set:
    the plan option, re-emitted."""
    from kgen.plan import PeriodSets
    from kgen.targets.sm90.promotion import with_period_sets

    return replanned(kernel, schedule, lambda plan: with_period_sets(plan, PeriodSets(sets)))


def replanned(kernel, schedule, change):
    import dataclasses

    from kgen.api import build
    from kgen.emit import emit

    built = build(block_variant(kernel, *schedule) if schedule else kernel)
    plan = change(built.plan)
    return dataclasses.replace(built, plan=plan, source=emit(
        plan, source_name="gemm_fp8_blockwise.kg", source_hash="variant", command="bench/fp8.py"))


def bound_variants(kernel, tensor_kernel, tile) -> dict:
    from kgen.api import build
    from kgen.plan import PromotionBound
    from kgen.targets.sm90.promotion import without_promotion

    return {BOUND_BLOCK: replanned(kernel, None, without_promotion),
            BOUND_LOADS: replanned(kernel, None, lambda plan: without_promotion(
                plan, PromotionBound.UNLOADED)),
            BOUND_TENSOR: build(block_variant(tensor_kernel, None, tile, 4))}


def block_variant(kernel, kind, tile, stages, cluster=None):
    import dataclasses

    from kgen import ir

    g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*tile), warps=ir.WarpGrid(2, 4),
                            stages=ir.StageCount(stages),
                            cluster=ir.ClusterShape(*cluster) if cluster else None)
    return dataclasses.replace(kernel, gemms=(g,),
                               schedule=ir.Schedule.from_name(kind) if kind else None)


def blockwise_rows(torch, shapes, stream, l2, variants=False, overlap=False, sets=False,
                   loads=False):
    from kgen.api import build, build_file, load_built
    from kgen.parse import parse_file

    from kgen.harness.timing import rotation_count, time_kernel

    rows = []
    built = {name: build_file(ROOT / "examples" / f"gemm_fp8_{name}.kg")
             for name in ("blockwise", "tensorwise")}
    if variants or overlap:
        kernel = parse_file(ROOT / "examples" / "gemm_fp8_blockwise.kg").kernels[0]
        for label, schedule, turns, early in OVERLAP_VARIANTS:
            built[label] = overlap_variant(kernel, schedule, turns, early)
    if variants or sets:
        kernel = parse_file(ROOT / "examples" / "gemm_fp8_blockwise.kg").kernels[0]
        for label, schedule, period_sets in SETS_VARIANTS:
            built[label] = sets_variant(kernel, schedule, period_sets)
        tensor_kernel = parse_file(ROOT / "examples" / "gemm_fp8_tensorwise.kg").kernels[0]
        built |= bound_variants(kernel, tensor_kernel,
                                tuple(built["blockwise"].plan.gemms[0].tile))
    if variants or sets or loads:
        kernel = parse_file(ROOT / "examples" / "gemm_fp8_blockwise.kg").kernels[0]
        built[LOADS_VARIANT] = loads_variant(kernel)
        if loads:
            from kgen.plan import PromotionBound
            from kgen.targets.sm90.promotion import without_promotion

            built[BOUND_LOADS] = replanned(kernel, None, lambda plan: without_promotion(
                plan, PromotionBound.UNLOADED))
    if variants:
        for label, *schedule in BLOCK_VARIANTS:
            built[label] = build(block_variant(kernel, *schedule))
    started = time.perf_counter()
    compiled = {name: load_built(b) for name, b in built.items()}
    print(f"compiled in {time.perf_counter() - started:.2f} s; block-wise plan "
          f"{'x'.join(map(str, built['blockwise'].plan.gemms[0].tile))} "
          f"s{built['blockwise'].plan.gemms[0].stages} "
          f"{built['blockwise'].plan.schedule.scheduler.kind.value}")
    for m, n, k in shapes:
        flops = 2 * m * n * k
        count = rotation_count(m * k + n * k + 2 * m * n, l2)
        sets = [block_set(torch, m, n, k) for _ in range(count)]

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=count, stream=stream).median_ms

        s0 = sets[0]
        check_rows = torch.randperm(m, device="cuda")[:CHECK_ROWS].sort().values
        s0["D"].fill_(float("nan"))
        block = compiled["blockwise"]
        block.launch(block.bind(**s0), stream)
        torch.cuda.synchronize()
        assert not torch.isnan(s0["D"]).any(), "kgen left output elements unwritten"
        err = block_error(torch, s0["D"], s0, check_rows)
        bound_block = [block.bind(**s) for s in sets]
        tensor = compiled["tensorwise"]
        bound_tensor = [tensor.bind(A=s["A"], B=s["B"], D=s["D"], sa=1.0, sb=1.0) for s in sets]
        t_block = timed(lambda i: block.launch(bound_block[i % count], stream))
        t_tensor = timed(lambda i: tensor.launch(bound_tensor[i % count], stream))
        for label in built:
            if label in ("blockwise", "tensorwise"):
                continue
            own = compiled[label]
            if label == BOUND_TENSOR:
                own_err = float("nan")  # a bound: not the block-scaled product
                own_bound = [own.bind(A=s["A"], B=s["B"], D=s["D"], sa=1.0, sb=1.0) for s in sets]
            else:
                s0["D"].fill_(float("nan"))
                own.launch(own.bind(**s0), stream)
                torch.cuda.synchronize()
                own_err = (float("nan") if label in (BOUND_BLOCK, BOUND_LOADS)
                           else block_error(torch, s0["D"], s0, check_rows))
                own_bound = [own.bind(**s) for s in sets]
            t_own = timed(lambda i: own.launch(own_bound[i % count], stream))
            print(f"  variant {label}: {t_own:.4f} ms {flops / t_own / 1e9:.0f} TFLOP/s "
                  f"({t_tensor / t_own:.3f}x tensor-wise); err {own_err:.1e}", flush=True)
            rows.append(dict(figure="blockwise variant", variant=label, shape=[m, n, k],
                             ms=t_own, vs_tensorwise=t_tensor / t_own, rel_err=own_err))
        theirs, why = torch_blockwise(torch, s0)
        row = dict(figure="blockwise", shape=[m, n, k], ms=t_block, tflops=flops / t_block / 1e9,
                   tensorwise_ms=t_tensor, vs_tensorwise=t_tensor / t_block, rel_err=err)
        line = (f"{m}x{n}x{k}: block-wise {t_block:.4f} ms {row['tflops']:.0f} TFLOP/s, "
                f"tensor-wise {t_tensor:.4f} ms {flops / t_tensor / 1e9:.0f} TFLOP/s: "
                f"{row['vs_tensorwise']:.3f}x tensor-wise's speed; err {err:.1e}")
        if theirs is not None:
            t_torch = timed(lambda i: torch_blockwise(torch, sets[i % count]))
            row.update(torch_ms=t_torch, vs_torch=t_torch / t_block, torch_api=why,
                       torch_rel_err=block_error(torch, theirs, s0, check_rows))
            line += (f"; torch block-wise ({why}) {t_torch:.4f} ms: {row['vs_torch']:.3f}x torch "
                     f"(err {row['torch_rel_err']:.1e})")
        else:
            row.update(torch_missing=why)
            line += f"; torch block-wise: none ({why})"
        print(line, flush=True)
        rows.append(row)
    ratios = [r["vs_tensorwise"] for r in rows if r["figure"] == "blockwise"]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"block-wise: geometric mean {geo:.3f}x the tensor-wise kernel's speed, lowest "
          f"{min(ratios):.3f}x")
    return rows


# ---------------------------------------------------------------------------------------------
# bench/fp8.py --fp8-out (issue 53): the row-scaled FP8-out epilogue with amax
# (examples/gemm_fp8_out_amax.kg: Y = e4m3(acc * sa[row] * sb[col] * scale_out), saturated, and
# amax = max |acc * sa[row] * sb[col]|) beside the bare FP8 kernel (examples/gemm_fp8_tensorwise.kg
# with unit scales: bf16 out through the copy engine) on the same operands, and the unfused
# PyTorch (torch._scaled_mm row-wise to bf16, then the amax and the saturating cast), timed alike
# (CUDA events, the median, inputs rotated past L2; the FP8-out kernel's time includes its amax
# initialization launch). Y is first checked, poisoned, against the float64 product rounded to
# e4m3 (one e4m3 step and FP8's accumulation bound, as tests/gpu/test_fp8_out_gpu.py), and amax
# against the float64 maximum.

E4M3_MAX = 448.0


def out_set(torch, m, n, k):
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa = torch.rand(m, device="cuda") + 0.5
    sb = torch.rand(n, device="cuda") + 0.5
    y = torch.empty(m, n, device="cuda", dtype=torch.float8_e4m3fn)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    amax = torch.zeros(1, device="cuda")
    return dict(A=a, B=b, sa=sa, sb=sb, Y=y, D=d, amax=amax)


def torch_unfused(torch, s, scale_out):
    d = torch._scaled_mm(s["A"], s["B"], scale_a=s["sa"][:, None].contiguous(),
                         scale_b=s["sb"][None, :].contiguous(),
                         out_dtype=torch.bfloat16)
    amax = d.abs().amax()
    y = (d.float() * scale_out).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y, amax


def out_check(torch, s, scale_out, rows):
    """(worst |Y - ref| over `rows` as a fraction of tests/gpu/test_fp8_out_gpu.py's bound: one
    e4m3 step of the reference plus FP8's accumulation bound; amax's relative error)."""
    k = s["A"].shape[1]
    scales = s["sa"][rows].double()[:, None] * s["sb"].double()[None, :]
    ref = (s["A"][rows].double() @ s["B"].double()) * scales
    ref_abs = (s["A"][rows].double().abs() @ s["B"].double().abs()) * scales
    full = (s["A"].double() @ s["B"].double()).mul_(s["sa"].double()[:, None])
    amax_ref = full.mul_(s["sb"].double()[None, :]).abs().max().item()
    want = (ref * scale_out).clamp(-E4M3_MAX, E4M3_MAX)
    got = s["Y"][rows].double()
    step = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0 ** -6))) - 3)
    bound = step + (-(-k // 32) + 1) * 2.0 ** -13 * scale_out * ref_abs
    return ((got - want).abs() / bound).max().item(), abs(s["amax"].item() - amax_ref) / amax_ref


def without_amax(text: str) -> str:
    """The FP8-out example without its amax (the reduction's cost is the difference)."""
    for line in ("      amax = reduce_absmax(d)\n", "  scalar amax : f32 out\n"):
        assert line in text, line
        text = text.replace(line, "")
    return text


def fp8_out_rows(torch, shapes, stream, l2):
    from kgen.api import build, build_file, load_built
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse

    built = {name: build_file(ROOT / "examples" / f"gemm_fp8_{name}.kg")
             for name in ("out_amax", "tensorwise")}
    text = without_amax((ROOT / "examples" / "gemm_fp8_out_amax.kg").read_text())
    built["out"] = build(parse(text, "gemm_fp8_out.kg").kernels[0], source_name="gemm_fp8_out.kg")
    started = time.perf_counter()
    compiled = {name: load_built(b) for name, b in built.items()}
    plan = built["out_amax"].plan
    print(f"compiled in {time.perf_counter() - started:.2f} s; FP8-out plan "
          f"{'x'.join(map(str, plan.gemms[0].tile))} s{plan.gemms[0].stages} "
          f"{plan.schedule.scheduler.kind.value}, output {plan.schedule.gemms[0].output.path.value}")
    rows = []
    scale_out = 64.0  # the products are O(1): |Y| up to about 400, as 448 / amax would pick
    for m, n, k in shapes:
        flops = 2 * m * n * k
        count = rotation_count(m * k + n * k + 3 * m * n, l2)
        sets = [out_set(torch, m, n, k) for _ in range(count)]

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=count, stream=stream).median_ms

        out, bare = compiled["out_amax"], compiled["tensorwise"]
        s0 = sets[0]
        s0["Y"].view(torch.uint8).fill_(0x7F)  # NaN in e4m3
        s0["amax"].fill_(float("nan"))
        out.launch(out.bind(A=s0["A"], B=s0["B"], Y=s0["Y"], sa=s0["sa"], sb=s0["sb"],
                            scale_out=scale_out, amax=s0["amax"]), stream)
        torch.cuda.synchronize()
        assert not torch.isnan(s0["Y"].float()).any(), "kgen left output elements unwritten"
        rows_checked = torch.randperm(m, device="cuda")[:256].sort().values
        y_err, amax_err = out_check(torch, s0, scale_out, rows_checked)
        saturated = (s0["Y"].float().abs() == E4M3_MAX).float().mean().item()
        bound_out = [out.bind(A=s["A"], B=s["B"], Y=s["Y"], sa=s["sa"], sb=s["sb"],
                              scale_out=scale_out, amax=s["amax"]) for s in sets]
        bound_bare = [bare.bind(A=s["A"], B=s["B"], D=s["D"], sa=1.0, sb=1.0) for s in sets]
        t_out = timed(lambda i: out.launch(bound_out[i % count], stream))
        t_bare = timed(lambda i: bare.launch(bound_bare[i % count], stream))
        plain = compiled["out"]  # Y alone: the amax's cost is t_out - t_plain
        bound_plain = [plain.bind(A=s["A"], B=s["B"], Y=s["Y"], sa=s["sa"], sb=s["sb"],
                                  scale_out=scale_out) for s in sets]
        t_plain = timed(lambda i: plain.launch(bound_plain[i % count], stream))
        t_torch = timed(lambda i: torch_unfused(torch, sets[i % count], scale_out))
        row = dict(figure="fp8-out amax", shape=[m, n, k], ms=t_out, bare_ms=t_bare,
                   no_amax_ms=t_plain, no_amax_x_bare=t_plain / t_bare,
                   x_bare=t_out / t_bare, torch_unfused_ms=t_torch, vs_torch=t_torch / t_out,
                   y_err_over_bound=y_err, amax_rel_err=amax_err, saturated=saturated)
        rows.append(row)
        print(f"{m}x{n}x{k}: FP8-out + amax {t_out:.4f} ms ({flops / t_out / 1e9:.0f} TFLOP/s), "
              f"bare {t_bare:.4f} ms: {row['x_bare']:.3f}x the bare time (without amax "
              f"{t_plain:.4f} ms, {t_plain / t_bare:.3f}x); unfused torch "
              f"{t_torch:.4f} ms ({row['vs_torch']:.2f}x); Y error {y_err:.2f} of its bound, "
              f"amax err {amax_err:.1e}, {100 * saturated:.2f}% saturated", flush=True)
    ratios = [r["x_bare"] for r in rows]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    plain = [r["no_amax_x_bare"] for r in rows]
    print(f"FP8-out + amax: geometric mean {geo:.3f}x the bare kernel's time, highest "
          f"{max(ratios):.3f}x; without amax {math.exp(sum(map(math.log, plain)) / len(plain)):.3f}x")
    return rows


# bench/fp8.py --sm89: sm_89's FP8 GEMM (examples/gemm_fp8_sm89.kg, mma.sync m16n8k32, row-wise
# scales) as kgen's runtime runs it here: the same source built for this device's arch (on an
# H100/H200 an sm_90a cubin, not compute_89 PTX), beside torch._scaled_mm and kgen's wgmma kernel
# (gemm_fp8_rowwise.kg), timed and checked as above; ptxas' spills of this build printed (the
# sm_89 build of every listed tile has none). SM89_TILES: written beside the builder's.
SM89_TILES = (((64, 64, 128), (2, 2), 4), ((64, 128, 128), (2, 2), 4),
              ((128, 128, 128), (2, 2), 3))


def sm89_rows(torch, shapes, stream, l2):
    from kgen import ir
    from kgen.api import build, build_file, load_built
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse_file
    from kgen.runtime.device import device_info
    from kgen.runtime.nvrtc import compile_cubin

    kernel, arch = parse_file(ROOT / "examples" / "gemm_fp8_sm89.kg").kernels[0], device_info().arch
    built = {"sm_89 builder": build(kernel)}
    for tile, warps, stages in SM89_TILES:
        g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*tile),
                                warps=ir.WarpGrid(*warps), stages=ir.StageCount(stages))
        label = f"sm_89 {'x'.join(map(str, tile))} w{warps[0]}x{warps[1]} s{stages}"
        built[label] = build(dataclasses.replace(kernel, gemms=(g,)))
    for label, b in built.items():
        result = compile_cubin(b.source, b.plan.name, arch)
        print(f"{label}: {'x'.join(map(str, b.plan.gemms[0].tile))}; built for {arch}: spill "
              f"stores {result.spill_stores}, loads {result.spill_loads}", flush=True)
    compiled = {label: load_built(b) for label, b in built.items()}
    wgmma = load_built(build_file(ROOT / "examples" / "gemm_fp8_rowwise.kg"))
    rows = []
    for m, n, k in shapes:
        flops, count = 2 * m * n * k, rotation_count(m * k + n * k + 2 * m * n, l2)
        sets = [make_set(torch, m, n, k, "row-wise") for _ in range(count)]

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=count, stream=stream).median_ms

        base = timed(lambda i: torch_fp8(torch, *sets[i % count]))
        wgmma_args = [wgmma.bind(**s) for s, _ in sets]
        t_wgmma = timed(lambda i: wgmma.launch(wgmma_args[i % count], stream))
        print(f"\nrow-wise {m}x{n}x{k}: torch._scaled_mm {base:.4f} ms ({flops / base / 1e9:.0f} "
              f"TFLOP/s); kgen sm_90a wgmma {t_wgmma:.4f} ms ({flops / t_wgmma / 1e9:.0f} TFLOP/s)")
        for label, own in compiled.items():
            ours, theirs = check(torch, own, *sets[0], stream)
            args = [own.bind(**s) for s, _ in sets]
            t = timed(lambda i: own.launch(args[i % count], stream))
            rows.append(dict(figure="sm89", variant=label, shape=[m, n, k], ms=t,
                             tflops=flops / t / 1e9, vs_torch=base / t, vs_wgmma=t_wgmma / t,
                             rel_err=ours, torch_rel_err=theirs, built_for=arch))
            print(f"  {label:28s} {t:.4f} ms {flops / t / 1e9:5.0f} TFLOP/s {base / t:.3f}x "
                  f"torch._scaled_mm, {t_wgmma / t:.3f}x kgen's wgmma kernel; err {ours:.1e} "
                  f"(torch {theirs:.1e})", flush=True)
    return rows


def main() -> int:
    import torch

    from kgen import ir
    from kgen.api import build, load_built
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse_file

    from hopper_gemm import device_setup

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="the first shape only")
    parser.add_argument("--variants", action="store_true", help="written schedules too")
    parser.add_argument("--shapes", default=None, help="MxNxK,... instead of the issue's")
    parser.add_argument("--llama", action="store_true", help="the Llama-class shapes too")
    parser.add_argument("--blockwise", action="store_true",
                        help="block scales (1x128 A, 128x128 B) beside kgen's tensor-wise kernel "
                        "and torch's block-wise scaled_mm, instead of the tables above")
    parser.add_argument("--overlap", action="store_true",
                        help="with --blockwise: the promotion overlap's plan options only "
                        "(--variants times them and the written schedules)")
    parser.add_argument("--sets", action="store_true",
                        help="with --blockwise: the period sets' plan options, tile widths 144 "
                        "and 160, and the timing bounds (--variants times them too)")
    parser.add_argument("--loads", action="store_true",
                        help="with --blockwise: the producer's scale copies beside the "
                        "rulebook's consumer loads, and the bound without scale loads")
    parser.add_argument("--fp8-out", action="store_true",
                        help="the row-scaled FP8-out epilogue with amax beside the bare kernel, "
                        "at the Llama-class shapes (--quick: 4096^3 only)")
    parser.add_argument("--sm89", action="store_true",
                        help="sm_89's FP8 mma.sync kernel (examples/gemm_fp8_sm89.kg, built for "
                        "this device's arch) beside torch._scaled_mm and kgen's wgmma kernel, "
                        "row-wise, at 4096^3 and 8192^3 (or --shapes)")
    opts = parser.parse_args()
    props, stream, l2 = device_setup(torch)
    shapes = ([tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",")]
              if opts.shapes else list(SHAPES))
    if opts.llama:
        shapes += [s for s in LLAMA if s not in shapes]
    if opts.quick:
        shapes = shapes[:1]
    if opts.fp8_out:
        chosen = shapes if opts.shapes else list(LLAMA)
        rows = fp8_out_rows(torch, [SHAPES[0]] if opts.quick else chosen, stream, l2)
        if opts.json:
            Path(opts.json).write_text(json.dumps(rows, indent=1))
        return 0
    if opts.sm89:
        chosen = shapes if opts.shapes else list(SHAPES[:2])
        rows = sm89_rows(torch, chosen[:1] if opts.quick else chosen, stream, l2)
        if opts.json:
            Path(opts.json).write_text(json.dumps(rows, indent=1))
        return 0
    if opts.blockwise:
        chosen = shapes if opts.shapes else [BLOCK_SHAPE] + (list(LLAMA) if opts.llama else [])
        rows = blockwise_rows(torch, chosen[:1] if opts.quick else chosen, stream, l2,
                              variants=opts.variants, overlap=opts.overlap, sets=opts.sets,
                              loads=opts.loads)
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
