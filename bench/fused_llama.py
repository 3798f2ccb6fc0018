"""Issue 53's fused epilogues at the Llama-class shapes, on an H100/H200, in one process: bf16
GEMMs (A [M, K] row-major, the weight B = W^T [K, N] column-major, N x K the weight's shape) with
the SwiGLU gate `silu(acc) * U`, `gelu(acc + bias[col])` and the residual add `acc + C` (U and C
bf16 [M, N]), each a `.kg` text with no schedule lines (the builder's choice for the sizes:
kgen/lower/builder.py's `sized`, as `kgen run --size` and `kgen.load` take it), beside the bare
kernel of the same shape (`D = acc`, also no schedule lines), the unfused PyTorch of each
epilogue (kgen/harness/torch_eval.py, what `kgen run --bench` times) and torch.matmul.

    bash .gpu/device-run.sh python3 bench/fused_llama.py [--json OUT.json] [--quick]
        [--epilogues swiglu,...] [--shapes 2048x4096x4096,...] [--variants] [--no-graph]

Each kernel is first checked, its output poisoned with NaN, against the float64 product of its
bf16 operands with the epilogue applied in float64 (CHECK_ROWS random rows; every element
checked for being written), with kgen.reference's bf16 tolerance. Times: CUDA events around each
run, the median of 30, input sets rotated past L2 (kgen/harness/timing.py); `device` is the
device time per call of 10 calls captured in a CUDA graph and replayed (bench/call_path.py's
graph_ms). The last lines: each epilogue's geometric mean of its time over the bare kernel's
and the highest (issue 53: at most 1.05x and 1.10x), and what reading U or C costs at the
bandwidth alone (its bytes over the device's bandwidth, against the bare kernel's time).
--variants adds written schedules (tile, stages, ping-pong) of each fused kernel (VARIANTS) and
the builder's plan with one component changed (PLAN_VARIANTS: the epilogue's functions spelled
as written, EpilogueMath; the walk unrolled, EpilogueGroups), each where it changes the code.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fp8 import LLAMA  # noqa: E402  issue 53's M 2048 and 8192 by the three weights

from kgen.plan import EpilogueGroups, EpilogueMath  # noqa: E402

CHECK_ROWS = 256
TEXT = """\
kernel {name} {{
  target sm_90a
{head}  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
{inputs}  tensor D : bf16[M, N] row out
  gemm g = A @ B accumulate f32 {{
{lines}    epilogue {{ D = {expr} }}
  }}
}}
"""
# name: (the input it reads beside A and B, its declaration, the epilogue)
EPILOGUES = {
    "bare": (None, "", "acc"),
    "swiglu": ("U", "  tensor U : bf16[M, N] row\n", "silu(acc) * U"),
    "gelu_bias": ("bias", "  vector bias : f32[N]\n", "gelu(acc + bias[col])"),
    "residual": ("C", "  tensor C : bf16[M, N] row\n", "acc + C"),
}
# --variants: written schedules of each fused kernel, (schedule line, gemm lines)
VARIANTS = {
    "128x256 s3": ("", "tile 128x256x64  warps 2x4  stages 3"),
    "128x192 s4": ("", "tile 128x192x64  warps 2x4  stages 4"),
    "pingpong 128x128 s5": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 5"),
}


# --variants: the builder's plan with a component changed (plan.with_gemm_schedule), re-emitted
PLAN_VARIANTS = {
    "as written": lambda: dict(math=EpilogueMath()),  # expf, IEEE division, erff
    "unrolled": lambda: dict(groups=EpilogueGroups()),  # one walk, not groups of 64 columns
}


def variant_kinds(fused: list[str]) -> list[tuple[str, str]]:
    """(epilogue, variant) of --variants."""
    return [(e, v) for e in fused for v in [*VARIANTS, *PLAN_VARIANTS]]


def kernel_text(epilogue: str, variant: str | None = None) -> str:
    _, inputs, expr = EPILOGUES[epilogue]
    head, lines = VARIANTS[variant] if variant in VARIANTS else ("", "")
    suffix = "".join(ch for ch in variant if ch.isalnum()) if variant else ""
    return TEXT.format(name=f"llama_{epilogue}{'_' + suffix if suffix else ''}",
                       head=f"  {head}\n" if head else "", inputs=inputs, expr=expr,
                       lines=f"    {lines}\n" if lines else "")


def built_for(text: str, sizes: dict[str, int], variant: str | None = None):
    """The kernel of `text` built for these sizes: the configuration they call for where the
    text leaves its schedule to kgen (as kgen run and kgen.load), else as written; a plan
    variant's component changed in that plan (None where that changes no line of the code)."""
    import dataclasses

    from kgen.api import build_verified, sized_config
    from kgen.emit import emit
    from kgen.parse import parse

    kernel = parse(text, "fused_llama.kg").kernels[0]
    built = build_verified(kernel, source_name="fused_llama.kg", command="bench/fused_llama.py",
                           config=sized_config(kernel, None, sizes))
    if variant not in PLAN_VARIANTS:
        return built
    plan = built.plan.with_gemm_schedule(**PLAN_VARIANTS[variant]())
    source, builders = (emit(p, source_name="fused_llama.kg", source_hash=variant,
                             command="bench/fused_llama.py") for p in (plan, built.plan))
    return None if source == builders else dataclasses.replace(built, plan=plan, source=source)


def compile_all_built(builts, arch: str) -> None:
    """NVRTC for every distinct source, in parallel processes, into the cubin cache that
    load_built then reads (kgen/tune/compile.py)."""
    from kgen.tune.compile import Job, compile_all

    sources = {b.source: b for b in builts}
    jobs = [Job(i, b.source, b.plan.name, arch, b.plan.narrow_kernel)
            for i, b in enumerate(sources.values())]
    started = time.perf_counter()
    results = compile_all(jobs)
    failed = [r.error.splitlines()[0] for r in results.values() if not r.ok]
    assert not failed, failed
    spills = [f"{jobs[i].name}: {r.local_memory}" for i, r in results.items() if r.local_memory]
    print(f"compiled {len(jobs)} kernels in {time.perf_counter() - started:.1f} s"
          + (f"; local memory: {spills}" if spills else ""), flush=True)


def make_set(torch, m: int, n: int, k: int) -> dict:
    """One input set: A scaled so that the accumulators are O(1) (the epilogues' functions
    bend there), the weight, U, C, bias and the output."""
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return dict(A=a, B=w.t(), U=torch.randn(m, n, device="cuda", dtype=torch.bfloat16),
                C=torch.randn(m, n, device="cuda", dtype=torch.bfloat16),
                bias=torch.randn(n, device="cuda"),
                D=torch.empty(m, n, device="cuda", dtype=torch.bfloat16))


def args_of(epilogue: str, s: dict) -> dict:
    extra = EPILOGUES[epilogue][0]
    return dict(A=s["A"], B=s["B"], D=s["D"], **({extra: s[extra]} if extra else {}))


def reference(torch, epilogue: str, s: dict, rows):
    """The float64 epilogue of the float64 product of the bf16 operands, for `rows`."""
    acc = s["A"][rows].double() @ s["B"].double()
    if epilogue == "swiglu":
        return acc * torch.sigmoid(acc) * s["U"][rows].double()
    if epilogue == "gelu_bias":
        z = acc + s["bias"].double()
        return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))
    if epilogue == "residual":
        return acc + s["C"][rows].double()
    return acc


def check(torch, compiled, epilogue: str, s: dict, stream: int) -> tuple[bool, float]:
    """kgen's output, poisoned first, against the reference over CHECK_ROWS rows (kgen.reference's
    bf16 tolerance; a NaN left anywhere fails): (ok, the worst |error| over its tolerance)."""
    from kgen import ir
    from kgen.reference import compare

    s["D"].fill_(float("nan"))
    compiled.launch(compiled.bind(**args_of(epilogue, s)), stream)
    torch.cuda.synchronize()
    unwritten = int(torch.isnan(s["D"]).sum().item())
    m = s["A"].shape[0]
    rows = torch.randperm(m, device="cuda")[:CHECK_ROWS].sort().values
    ref = reference(torch, epilogue, s, rows)
    got = s["D"][rows].double()
    result = compare(got.cpu().numpy(), ref.cpu().numpy(), ir.DType.BF16)
    worst = ((got - ref).abs() / (result.atol + result.rtol * ref.abs())).max().item()
    return result.ok and not unwritten, worst


def main() -> int:
    import torch

    from kgen.harness.run import device_peaks
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.harness.torch_eval import TorchEvaluator
    from kgen.parse import parse

    from call_path import graph_ms
    from hopper_gemm import device_setup

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="the first shape only")
    parser.add_argument("--epilogues", default=",".join(e for e in EPILOGUES if e != "bare"))
    parser.add_argument("--shapes", default=None, help="MxNxK,... instead of the issue's six")
    parser.add_argument("--variants", action="store_true",
                        help="written schedules and plan variants too")
    parser.add_argument("--no-graph", action="store_true", help="without the CUDA-graph column")
    opts = parser.parse_args()
    props, stream, l2 = device_setup(torch)
    bandwidth = device_peaks(props.name)[1] or 4.8e12
    shapes = ([tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",")]
              if opts.shapes else list(LLAMA))[:1 if opts.quick else None]
    fused = [e for e in opts.epilogues.split(",") if e]
    assert all(e in EPILOGUES for e in fused), fused
    kinds = [("bare", None)] + [(e, None) for e in fused if e != "bare"] + (
        variant_kinds([e for e in fused if e != "bare"]) if opts.variants else [])
    builts = {(e, v, shape): built_for(kernel_text(e, v), dict(M=shape[0], N=shape[1],
                                                                K=shape[2]), v)
              for e, v in kinds for shape in shapes}
    same = {key[:2] for key, b in builts.items() if b is None}  # a plan variant changing nothing
    kinds = [kind for kind in kinds if kind not in same]
    builts = {key: b for key, b in builts.items() if key[:2] not in same}
    from kgen.runtime.device import device_info

    compile_all_built(builts.values(), device_info().arch)
    from kgen.api import load_built

    loaded = {}  # per source: each distinct kernel loaded once
    rows = []
    failed = 0
    for m, n, k in shapes:
        flops = 2 * m * n * k
        count = rotation_count(2 * (m * k + n * k + 3 * m * n) + 4 * n, l2)
        sets = [make_set(torch, m, n, k) for _ in range(count)]

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=count, stream=stream).median_ms

        def device_ms(fn):
            if opts.no_graph:
                return None
            return graph_ms(lambda i: fn(i % count), count, calls=10, replays=5)

        mm = timed(lambda i: torch.matmul(sets[i]["A"], sets[i]["B"], out=sets[i]["D"]))
        print(f"\n{m}x{n}x{k}: torch.matmul {mm:.4f} ms ({flops / mm / 1e9:.0f} TFLOP/s)",
              flush=True)
        bare_ms = None
        for e, v in kinds:
            built = builts[(e, v, (m, n, k))]
            if built.source not in loaded:
                loaded[built.source] = load_built(built)
            compiled = loaded[built.source]
            ok, err = check(torch, compiled, e, sets[0], stream)
            failed += not ok
            bound = [compiled.bind(**args_of(e, s)) for s in sets]
            t = timed(lambda i: compiled.launch(bound[i], stream))
            dev = device_ms(lambda i: compiled.launch(
                bound[i], torch.cuda.current_stream().cuda_stream))
            if e == "bare":
                bare_ms, bare_dev = t, dev
            kernel = parse(kernel_text(e), "fused_llama.kg").kernels[0]
            evaluators = [TorchEvaluator(kernel, args_of(e, s), {}) for s in sets]
            unfused = timed(lambda i: evaluators[i].run()) if v is None else None
            p = built.plan
            gs = p.schedule.gemms[0]
            plan_text = (f"{p.schedule.scheduler.kind.value} {'x'.join(map(str, p.gemms[0].tile))}"
                         f" s{p.gemms[0].stages} staging {gs.staging.boxes or 'whole'}"
                         + (f" staged {gs.staged.param}" if gs.staged.param else "")
                         + (" intrinsics" if gs.math.intrinsics else "")
                         + (f" groups {gs.groups.count}" if gs.groups.count > 1 else ""))
            row = dict(epilogue=e, variant=v or "builder", shape=[m, n, k], ms=t,
                       tflops=flops / t / 1e9, bare_ms=bare_ms, x_bare=t / bare_ms,
                       device_ms=dev, device_x_bare=dev / bare_dev if dev else None,
                       matmul_ms=mm, unfused_ms=unfused,
                       vs_unfused=unfused / t if unfused else None, ok=ok, err_over_tol=err,
                       plan=plan_text)
            if EPILOGUES[e][0] in ("U", "C"):  # its bytes at the bandwidth alone
                row["input_bytes_ms"] = 2 * m * n / bandwidth * 1e3
            rows.append(row)
            print(f"  {e:10s} {(v or 'builder'):20s} {t:.4f} ms {row['tflops']:4.0f} TFLOP/s "
                  f"{row['x_bare']:.3f}x bare"
                  + (f" (device {dev:.4f} ms, {row['device_x_bare']:.3f}x)" if dev else "")
                  + (f", {row['vs_unfused']:.2f}x unfused {unfused:.4f} ms" if unfused else "")
                  + f"; err {err:.2f} of tol{'' if ok else ' CHECK FAILED'}; {plan_text}",
                  flush=True)
        del sets
    print("\n| epilogue | " + " | ".join(f"{m}x{n}x{k}" for m, n, k in shapes)
          + " | geomean | highest |")
    print("|---" * (len(shapes) + 3) + "|")
    for e, v in kinds:
        if e == "bare":
            continue
        ratios = [r["x_bare"] for r in rows if r["epilogue"] == e
                  and r["variant"] == (v or "builder")]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"| {e}{' ' + v if v else ''} | " + " | ".join(f"{x:.3f}" for x in ratios)
              + f" | {geo:.3f} | {max(ratios):.3f} |")
    for e in fused:
        if EPILOGUES[e][0] in ("U", "C"):
            share = [r["input_bytes_ms"] / r["bare_ms"] for r in rows
                     if r["epilogue"] == e and r["variant"] == "builder"]
            print(f"{e}: {EPILOGUES[e][0]}'s bytes at {bandwidth / 1e12:.1f} TB/s alone take "
                  f"{', '.join(f'{x:.3f}' for x in share)} of the bare time")
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(device=props.name, date=time.strftime(
            "%Y-%m-%d"), rows=rows), indent=1))
    if failed:
        print(f"{failed} kernels failed their check")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
