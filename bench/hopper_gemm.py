"""Issue 15 on an H100/H200, in one process: kgen's warp-specialized sm_90a GEMM (TMA ring,
wgmma, cooperative or ping-pong: Schedule values, built from the examples' IR) beside
torch.matmul and the unfused PyTorch epilogue, all timed the same way (CUDA events around each
run, the median, inputs rotated past L2), every kgen kernel first checked against a float32
PyTorch reference on fresh random inputs with its outputs poisoned.

    bash .gpu/device-run.sh python3 bench/hopper_gemm.py [--json OUT.json] [--quick]

Besides the issue's targets it runs kernels and shapes that are in no example (marked "own").
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK_TFLOPS = 989.0  # dense f16/bf16 on an H100/H200 SXM


def device_setup(torch):
    """What each bench script's run starts with: torch seeded (0) and the device, torch and kgen
    versions printed. (The device's properties, the current stream's handle, its L2 size in
    bytes: rotation_count's.)"""
    import kgen

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print("device", props.name, "torch", torch.__version__, "kgen", kgen.__version__)
    return props, torch.cuda.current_stream().cuda_stream, props.L2_cache_size


def variants(kernel, ir):
    """The schedules measured, as Schedule values of the same kernel: (label, kernel)."""
    g = kernel.gemms[0]

    def with_(schedule, tile, stages, cluster=None):
        gemm = dataclasses.replace(g, tile=ir.TileShape(*tile, loc=g.tile.loc),
                                   stages=ir.StageCount(stages, loc=g.stages.loc),
                                   cluster=cluster and ir.ClusterShape(*cluster, loc=g.tile.loc))
        return dataclasses.replace(kernel, gemms=(gemm,), schedule=schedule, target=ir.Arch.SM90A)

    # the builder's default first (128x256 on 4 stages, the epilogue tile where the staging does
    # not fit whole; 3 stages where the epilogue reads C), then clusters on it
    c_first = any(p.name == "C" for p in kernel.params)
    return [("cooperative 128x256 s4", with_(None, (128, 256, 64), 4)),
            ("cooperative 128x256 s3", with_(None, (128, 256, 64), 3)),
            ("128x256 s%d cluster 2x1" % (3 if c_first else 4),
             with_(None, (128, 256, 64), 3 if c_first else 4, (2, 1))),
            ("128x256 s%d cluster 1x2" % (3 if c_first else 4),
             with_(None, (128, 256, 64), 3 if c_first else 4, (1, 2))),
            ("pingpong 128x128 s5", with_(ir.Schedule.PINGPONG, (128, 128, 64), 5))]


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import build
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse, parse_file

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    props, stream, l2 = device_setup(torch)
    rows = []

    def timed(fn, nsets_bytes):
        return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(nsets_bytes, l2),
                           stream=stream).median_ms

    def measure(tag, kernel, sizes, torch_fns, reference, own=False):
        """Time each schedule variant of `kernel` and the PyTorch functions on the same sets."""
        m, n, k = sizes["M"], sizes["N"], sizes["K"]
        flops = 2 * m * n * k
        set_bytes = 2 * (m * k + n * k + m * n)
        sets = [make_inputs(torch, kernel, sizes)
                for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
        base = {}
        for name, fn in torch_fns.items():
            base[name] = timed(lambda i, fn=fn: fn(**sets[i % len(sets)]), set_bytes)
        line = f"\n{tag} {m}x{n}x{k}" + "".join(f" | {k_} {v:.4f} ms" for k_, v in base.items())
        print(line + f" ({flops / base['matmul'] / 1e9:.0f} TFLOP/s matmul)")
        for label, variant in variants(kernel, ir):
            try:
                built = build(variant)
                started = time.perf_counter()
                compiled = kgen.api.load_built(built)
                compile_s = time.perf_counter() - started
            except Exception as err:  # a refused or failed variant is a result too
                print(f"  {label:26s} not built: {str(err).splitlines()[0][:120]}")
                continue
            err = check(torch, compiled, kernel, sets[0], reference)
            outs = [{p.name: alloc(torch, p, sizes) for p in kernel.params
                     if p.role is ir.Role.OUT} for _ in sets]
            bound = [compiled.bind(**s, **o) for s, o in zip(sets, outs)]
            t = timed(lambda i: compiled.launch(bound[i % len(bound)], stream), set_bytes)
            s = built.plan.schedule
            row = dict(tag=tag, own=own, variant=label, kind=s.scheduler.kind.value,
                       store=s.gemms[0].output.path.value, shape=[m, n, k], ms=t,
                       tflops=flops / t / 1e9, peak_fraction=flops / t / 1e9 / PEAK_TFLOPS,
                       rel_err=err, compile_s=compile_s, **{f"torch_{a}_ms": v
                                                             for a, v in base.items()})
            row["vs_matmul"] = base["matmul"] / t  # > 1: faster than the bare matmul
            if "unfused" in base:
                row["vs_unfused"] = base["unfused"] / t
            rows.append(row)
            ratios = f"{row['vs_matmul']:.3f}x matmul (time {t / base['matmul']:.3f}x)"
            if "unfused" in base:
                ratios += f", {row['vs_unfused']:.2f}x unfused"
            print(f"  {label:26s} {t:.4f} ms {row['tflops']:5.0f} TFLOP/s "
                  f"({100 * row['peak_fraction']:.0f}% of peak) {ratios}; err {err:.1e}; "
                  f"{s.scheduler.kind.value}, {s.gemms[0].output.path.value}; "
                  f"compile {compile_s:.2f} s")

    # ---- the bare GEMM
    gemm = parse_file(ROOT / "examples/gemm.kg").kernels[0]
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 512)]
    if opts.quick:
        shapes = shapes[:1]
    for dtype in (ir.DType.BF16, ir.DType.F16):
        kernel = retyped(gemm, dtype, ir)
        for m, n, k in shapes:
            measure(f"gemm {dtype.dsl_name}", kernel, dict(M=m, N=n, K=k),
                    {"matmul": lambda A, B: torch.matmul(A, B)}, lambda A, B: A.float() @ B.float())

    # ---- the fused epilogues at 8192^3
    big = dict(M=8192, N=8192, K=8192)
    bias_relu = parse_file(ROOT / "examples/gemm_bias_relu.kg").kernels[0]
    measure("relu(alpha*acc+beta*C+bias)", bias_relu, big,
            {"matmul": lambda A, B, C, bias: torch.matmul(A, B),
             "unfused": lambda A, B, C, bias: torch.relu(1.5 * torch.matmul(A, B) + 0.5 * C + bias)},
            lambda A, B, C, bias: torch.relu(1.5 * (A.float() @ B.float()) + 0.5 * C.float() + bias))
    stats = parse_file(ROOT / "examples/evt_softmax_stats.kg").kernels[0]

    def unfused_stats(A, B, m_prev):
        s = torch.matmul(A, B).float()
        return s.amax(1), torch.exp(s - m_prev[:, None]).sum(1)

    measure("softmax stats", stats, big,
            {"matmul": lambda A, B, m_prev: torch.matmul(A, B), "unfused": unfused_stats},
            lambda A, B, m_prev: unfused_stats(A.float(), B.float(), m_prev))

    # ---- own kernels and shapes (in no example)
    leaky = parse(LEAKY, "leaky.kg").kernels[0]
    for m, n, k in [(8192, 8192, 8192), (4096, 11008, 4096)]:
        measure("own: leaky*scale[row]+bias", leaky, dict(M=m, N=n, K=k),
                {"matmul": lambda A, B, scale, bias: torch.matmul(A, B),
                 "unfused": lambda A, B, scale, bias: (lambda t: torch.where(t > 0, t, 0.01 * t)
                                                       * scale[:, None] + bias)(torch.matmul(A, B))},
                lambda A, B, scale, bias: (lambda t: torch.where(t > 0, t, 0.01 * t)
                                           * scale[:, None] + bias)(A.float() @ B.float()),
                own=True)
    residual = parse(RESIDUAL, "residual.kg").kernels[0]
    gelu = torch.nn.functional.gelu
    for m, n, k in [(4096, 11008, 4096), (6144, 5120, 3072)]:
        measure("own: C + 0.5*gelu(acc) bf16", residual, dict(M=m, N=n, K=k),
                {"matmul": lambda A, B, C: torch.matmul(A, B),
                 "unfused": lambda A, B, C: C + 0.5 * gelu(torch.matmul(A, B))},
                lambda A, B, C: C.float() + 0.5 * gelu(A.float() @ B.float()), own=True)
    measure("own: gemm bf16", retyped(gemm, ir.DType.BF16, ir), dict(M=6144, N=5120, K=3072),
            {"matmul": lambda A, B: torch.matmul(A, B)}, lambda A, B: A.float() @ B.float(),
            own=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


LEAKY = """
kernel leaky_scale_bias {
  target sm_90a
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  vector scale : f32[M]
  vector bias : f32[N]
  gemm g = A @ B accumulate f32 {
    tile 128x256x64  warps 2x4  stages 3
    epilogue { D = where(acc > 0, acc, 0.01 * acc) * scale[row] + bias[col] }
  }
}
"""


RESIDUAL = """
kernel residual_gelu {
  target sm_90a
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  tensor C : bf16[M, N] row
  tensor D : bf16[M, N] row out
  gemm g = A @ B accumulate f32 {
    tile 128x256x64  warps 2x4  stages 3
    epilogue { D = C + 0.5 * gelu(acc) }
  }
}
"""


def make_inputs(torch, kernel, sizes) -> dict:
    """One input set as torch tensors (outputs left to the kernel); A scaled by 1/sqrt(K)."""
    from kgen import ir

    args = {}
    for p in kernel.params:
        if p.role is ir.Role.OUT or p.kind is ir.ParamKind.SCALAR:
            continue
        dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[p.dtype.dsl_name]
        shape = [sizes[d] if isinstance(d, str) else d for d in p.shape]
        if p.kind is ir.ParamKind.TENSOR and p.layout is ir.Layout.COL:
            t = torch.randn(shape[::-1], device="cuda").to(dt).t()
        else:
            t = torch.randn(shape, device="cuda").to(dt)
        if p.name == "A":
            t = t / sizes["K"] ** 0.5
        args[p.name] = t
    return args


def retyped(kernel, dtype, ir):
    params = tuple(dataclasses.replace(p, dtype=dtype) if p.kind is ir.ParamKind.TENSOR else p
                   for p in kernel.params)
    return dataclasses.replace(kernel, params=params)


def alloc(torch, p, sizes):
    from kgen import ir

    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[p.dtype.dsl_name]
    shape = [sizes[d] if isinstance(d, str) else d for d in p.shape]
    if p.kind is ir.ParamKind.TENSOR and p.layout is ir.Layout.COL:
        return torch.empty(shape[::-1], device="cuda", dtype=dt).t()
    return torch.empty(shape, device="cuda", dtype=dt)


def check(torch, compiled, kernel, args, reference) -> float:
    """The largest relative error (norm) of the kernel's outputs against `reference`, outputs
    poisoned with NaN first; inf when an output holds a NaN."""
    from kgen import ir

    outs = {p.name: alloc(torch, p, _sizes(args)) for p in kernel.params
            if p.role is ir.Role.OUT}
    for o in outs.values():
        o.fill_(float("nan"))
    compiled(**args, **outs)
    torch.cuda.synchronize()
    want = reference(**args)
    want = want if isinstance(want, tuple) else (want,)
    worst = 0.0
    for got, ref in zip(outs.values(), want):
        got = got.float()
        if not torch.isfinite(got).all():
            return float("inf")
        worst = max(worst, float((got - ref).norm() / max(float(ref.norm()), 1e-30)))
    return worst


def _sizes(args) -> dict:
    a, b = args["A"], args["B"]
    return dict(M=a.shape[0], K=a.shape[1], N=b.shape[1])


if __name__ == "__main__":
    sys.exit(main())
