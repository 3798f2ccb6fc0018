"""bench/fp8.py --fp8-out (issue 53): the row-scaled FP8-out epilogue with amax
(examples/gemm_fp8_out_amax.kg: Y = e4m3(acc * sa[row] * sb[col] * scale_out), saturated, and
amax = max |acc * sa[row] * sb[col]|) beside the bare FP8 kernel (examples/gemm_fp8_tensorwise.kg
with unit scales: bf16 out through the copy engine) on the same operands, and the unfused
PyTorch (torch._scaled_mm row-wise to bf16, then the amax and the saturating cast), timed alike
(CUDA events, the median, inputs rotated past L2; the FP8-out kernel's time includes its amax
initialization launch). Y is first checked, poisoned, against the float64 product rounded to
e4m3 (one e4m3 step at most), and amax against the float64 maximum."""
from __future__ import annotations

import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
E4M3_MAX = 448.0


def make_set(torch, m, n, k):
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


def check(torch, s, scale_out, rows):
    """(worst |Y - ref| in e4m3 steps of ref over `rows`, amax's relative error)."""
    ref = (s["A"][rows].double() @ s["B"].double()) * s["sa"][rows].double()[:, None]
    ref = ref * s["sb"].double()[None, :]
    full = (s["A"].double() @ s["B"].double()).mul_(s["sa"].double()[:, None])
    amax_ref = full.mul_(s["sb"].double()[None, :]).abs().max().item()
    want = (ref * scale_out).clamp(-E4M3_MAX, E4M3_MAX)
    got = s["Y"][rows].double()
    step = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0 ** -6))) - 3)
    steps = ((got - want).abs() / step).max().item()
    return steps, abs(s["amax"].item() - amax_ref) / amax_ref


def fp8_out_rows(torch, shapes, stream, l2):
    from kgen.api import build_file, load_built
    from kgen.harness.timing import rotation_count, time_kernel

    built = {name: build_file(ROOT / "examples" / f"gemm_fp8_{name}.kg")
             for name in ("out_amax", "tensorwise")}
    started = time.perf_counter()
    compiled = {name: load_built(b) for name, b in built.items()}
    plan = built["out_amax"].plan
    print(f"compiled in {time.perf_counter() - started:.2f} s; FP8-out plan "
          f"{'x'.join(map(str, plan.gemms[0].tile))} s{plan.gemms[0].stages} "
          f"{plan.schedule.scheduler.kind.value}, output {plan.schedule.gemms[0].output.path.value}")
    rows = []
    scale_out = 64.0  # the products are O(1): some saturate at 448
    for m, n, k in shapes:
        flops = 2 * m * n * k
        count = rotation_count(m * k + n * k + 3 * m * n, l2)
        sets = [make_set(torch, m, n, k) for _ in range(count)]

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
        steps, amax_err = check(torch, s0, scale_out, rows_checked)
        saturated = (s0["Y"].float().abs() == E4M3_MAX).float().mean().item()
        bound_out = [out.bind(A=s["A"], B=s["B"], Y=s["Y"], sa=s["sa"], sb=s["sb"],
                              scale_out=scale_out, amax=s["amax"]) for s in sets]
        bound_bare = [bare.bind(A=s["A"], B=s["B"], D=s["D"], sa=1.0, sb=1.0) for s in sets]
        t_out = timed(lambda i: out.launch(bound_out[i % count], stream))
        t_bare = timed(lambda i: bare.launch(bound_bare[i % count], stream))
        t_torch = timed(lambda i: torch_unfused(torch, sets[i % count], scale_out))
        row = dict(figure="fp8-out amax", shape=[m, n, k], ms=t_out, bare_ms=t_bare,
                   x_bare=t_out / t_bare, torch_unfused_ms=t_torch, vs_torch=t_torch / t_out,
                   e4m3_steps=steps, amax_rel_err=amax_err, saturated=saturated)
        rows.append(row)
        print(f"{m}x{n}x{k}: FP8-out + amax {t_out:.4f} ms ({flops / t_out / 1e9:.0f} TFLOP/s), "
              f"bare {t_bare:.4f} ms: {row['x_bare']:.3f}x the bare time; unfused torch "
              f"{t_torch:.4f} ms ({row['vs_torch']:.2f}x); Y within {steps:.2f} e4m3 steps, "
              f"amax err {amax_err:.1e}, {100 * saturated:.2f}% saturated", flush=True)
    ratios = [r["x_bare"] for r in rows]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"FP8-out + amax: geometric mean {geo:.3f}x the bare kernel's time, highest "
          f"{max(ratios):.3f}x")
    return rows
