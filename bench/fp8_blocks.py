"""bench/fp8.py --blockwise (issue 53): kgen's FP8 GEMM with block scales
(examples/gemm_fp8_blockwise.kg: A's 1x128, B's 128x128, DeepGEMM's recipe) beside kgen's
tensor-wise kernel (examples/gemm_fp8_tensorwise.kg) on the same operands and torch's block-wise
scaled_mm where this torch has it, timed alike (CUDA events, the median, inputs rotated past
L2). Each kgen kernel is first checked, output poisoned, against the float64 product of the
dequantized operands over 256 rows."""
from __future__ import annotations

import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK_ROWS = 256


def make_set(torch, m, n, k):
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


def reference_rows(torch, s, rows):
    """The float64 product of the dequantized operands for `rows`."""
    k = s["A"].shape[1]
    n = s["B"].shape[1]
    a = s["A"][rows].double() * s["SA"][rows].double().repeat_interleave(128, dim=1)[:, :k]
    block = s["SB"].double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    return a @ (s["B"].double() * block[:n, :k].t())


def relative_error(torch, out, s, rows):
    ref = reference_rows(torch, s, rows)
    return (out[rows].double() - ref).abs().max().item() / ref.abs().max().item()


# Written schedules of the block-wise kernel timed with --variants: (label, kind, tile, stages)
VARIANTS = (("cooperative 128x128x128 s6", None, (128, 128, 128), 6, None),
            ("cooperative 128x128x128 s5", None, (128, 128, 128), 5, None),
            ("cooperative 128x192x128 s4 cluster 2x1", None, (128, 192, 128), 4, (2, 1)),
            ("cooperative 128x192x128 s4 cluster 1x2", None, (128, 192, 128), 4, (1, 2)),
            ("cooperative 128x128x128 s6 cluster 2x1", None, (128, 128, 128), 6, (2, 1)),
            ("cooperative 128x128x128 s6 cluster 1x2", None, (128, 128, 128), 6, (1, 2)),
            ("pingpong 64x128x128 s8", "pingpong", (64, 128, 128), 8, None))


def variant(kernel, kind, tile, stages, cluster=None):
    import dataclasses

    from kgen import ir

    g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*tile), warps=ir.WarpGrid(2, 4),
                            stages=ir.StageCount(stages),
                            cluster=ir.ClusterShape(*cluster) if cluster else None)
    return dataclasses.replace(kernel, gemms=(g,),
                               schedule=ir.Schedule.from_name(kind) if kind else None)


def blockwise_rows(torch, shapes, stream, l2, variants=False):
    from kgen.api import build, build_file, load_built
    from kgen.parse import parse_file

    from kgen.harness.timing import rotation_count, time_kernel

    rows = []
    built = {name: build_file(ROOT / "examples" / f"gemm_fp8_{name}.kg")
             for name in ("blockwise", "tensorwise")}
    if variants:
        kernel = parse_file(ROOT / "examples" / "gemm_fp8_blockwise.kg").kernels[0]
        for label, *schedule in VARIANTS:
            built[label] = build(variant(kernel, *schedule))
    started = time.perf_counter()
    compiled = {name: load_built(b) for name, b in built.items()}
    print(f"compiled in {time.perf_counter() - started:.2f} s; block-wise plan "
          f"{'x'.join(map(str, built['blockwise'].plan.gemms[0].tile))} "
          f"s{built['blockwise'].plan.gemms[0].stages} "
          f"{built['blockwise'].plan.schedule.scheduler.kind.value}")
    for m, n, k in shapes:
        flops = 2 * m * n * k
        count = rotation_count(m * k + n * k + 2 * m * n, l2)
        sets = [make_set(torch, m, n, k) for _ in range(count)]

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=count, stream=stream).median_ms

        s0 = sets[0]
        check_rows = torch.randperm(m, device="cuda")[:CHECK_ROWS].sort().values
        s0["D"].fill_(float("nan"))
        block = compiled["blockwise"]
        block.launch(block.bind(**s0), stream)
        torch.cuda.synchronize()
        assert not torch.isnan(s0["D"]).any(), "kgen left output elements unwritten"
        err = relative_error(torch, s0["D"], s0, check_rows)
        bound_block = [block.bind(**s) for s in sets]
        tensor = compiled["tensorwise"]
        bound_tensor = [tensor.bind(A=s["A"], B=s["B"], D=s["D"], sa=1.0, sb=1.0) for s in sets]
        t_block = timed(lambda i: block.launch(bound_block[i % count], stream))
        t_tensor = timed(lambda i: tensor.launch(bound_tensor[i % count], stream))
        for label in built:
            if label in ("blockwise", "tensorwise"):
                continue
            own = compiled[label]
            s0["D"].fill_(float("nan"))
            own.launch(own.bind(**s0), stream)
            torch.cuda.synchronize()
            own_err = relative_error(torch, s0["D"], s0, check_rows)
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
                       torch_rel_err=relative_error(torch, theirs, s0, check_rows))
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
