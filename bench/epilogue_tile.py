"""The epilogue tile (Staging, issue 15) on an H100/H200: the cooperative 128x256
kernel with 3 stages and the consumer's whole tile staged, against 4 stages, which fit only
with the epilogue tile's staging of two 64x64 boxes per consumer. The two are the same kernel
text but for its `stages` line; the plan fills the rest (kgen inspect: "<gemm> epilogue tile").

Every kernel is checked against a float32 reference with its outputs poisoned, then all of
them, torch.matmul and the unfused PyTorch epilogue are timed in turn, `--rounds` times (CUDA
events, median of 30, inputs rotated past L2); each figure is the fastest round.

    bash .gpu/device-run.sh python3 bench/epilogue_tile.py [--sizes 8192,8192,8192 ...] [--json OUT]
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
sys.path.insert(0, str(ROOT / "bench"))

from hopper_gemm import PEAK_TFLOPS, alloc, check, device_setup, make_inputs  # noqa: E402

HEAD = """\
kernel {name} {{
  target sm_90a
  tensor A : {dt}[M, K] row
  tensor B : {dt}[K, N] col
  tensor C : {dt}[M, N] row
  tensor D : {dt}[M, N] row out
  vector bias : f32[N]
  vector scale : f32[M]
  scalar alpha : f32 = 1.5
  scalar beta : f32 = 0.5
  gemm g = A @ B accumulate f32 {{
    tile {tile}  warps 2x4  stages {stages}{cluster}
    epilogue {{ D = {expr} }}
  }}
}}
"""

# (label, dtype, epilogue, float32 reference from acc = A @ B, the unfused PyTorch; the
# unfused forms of bench/hopper_gemm.py)
KERNELS = [
    ("bare", "f16", "acc", lambda acc, a: acc, None),
    ("C epilogue", "f16", "relu(alpha * acc + beta * C + bias[col])",
     lambda acc, a: (1.5 * acc + 0.5 * a["C"].float() + a["bias"]).relu(),
     lambda t, a: t.relu(1.5 * t.matmul(a["A"], a["B"]) + 0.5 * a["C"] + a["bias"])),
    ("own: leaky*scale+bias", "f16", "where(acc > 0, acc, 0.01 * acc) * scale[row] + bias[col]",
     lambda acc, a: acc.where(acc > 0, 0.01 * acc) * a["scale"][:, None] + a["bias"],
     lambda t, a: (lambda x: t.where(x > 0, x, 0.01 * x) * a["scale"][:, None] + a["bias"])(
         t.matmul(a["A"], a["B"]))),
    ("own: gelu(acc+bias) bf16", "bf16", "gelu(acc + bias[col])",
     lambda acc, a: _gelu(acc + a["bias"]),
     lambda t, a: t.nn.functional.gelu(t.matmul(a["A"], a["B"]) + a["bias"])),
]
VARIANTS = {"s3 whole tile": ("128x256x64", 3), "s4 epilogue tile": ("128x256x64", 4)}
# more Schedule values, for --variants: clusters sharing B (2x1) on either ring
MORE = {"s4 cluster 2x1": ("128x256x64", 4, "2x1"), "s3 cluster 2x1": ("128x256x64", 3, "2x1"),
        "s4 no C prefetch": ("128x256x64", 4)}
# a diagnostic text edit, for a decision only: the epilogue tile's staged C without its boxes'
# L2 prefetch during the mainloop (the emitted line cut)
PREFETCH_LINE = ("    for (int b = kStagesD; b < kFragM * (kTileN / 64); ++b) "
                 "prefetch_staged_box(b);\n")


def _gelu(x):
    import torch
    return torch.nn.functional.gelu(x)


def kernel_of(label, dt, expr, stages_tile, ir, parse):
    tile, stages, cluster = (*stages_tile, None)[:3]
    name = ("et_" + "".join(ch for ch in label if ch.isalnum()) + f"_s{stages}"
            + (f"_c{cluster.replace('x', '')}" if cluster else ""))
    kernel = parse(HEAD.format(name=name, dt=dt, expr=expr, tile=tile, stages=stages,
                               cluster=f"  cluster {cluster}" if cluster else ""),
                   f"{name}.kg").kernels[0]
    used = {"A", "B", "D"} | {p for p in ("C", "bias", "scale", "alpha", "beta") if p in expr}
    return dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name in used))


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import Built
    from kgen.emit import emit, emit_header
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.lower import lower
    from kgen.parse import parse
    from kgen.plan import VectorHome

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="*", default=["4096,4096,4096", "8192,8192,8192"])
    parser.add_argument("--kernels", nargs="*", default=None, help="labels to run (default all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--variants", nargs="*", default=None,
                        help=f"labels of {[*VARIANTS, *MORE]} (default: the first two)")
    opts = parser.parse_args()
    if opts.variants:
        every = {**VARIANTS, **MORE}
        VARIANTS.clear()
        VARIANTS.update({v: every[v] for v in opts.variants})
    props, stream, l2 = device_setup(torch)
    chosen = [k for k in KERNELS if opts.kernels is None or k[0] in opts.kernels]
    compiled = {}
    for label, dt, expr, _, _ in chosen:
        for variant, st in VARIANTS.items():
            kernel = kernel_of(label, dt, expr, st, ir, parse)
            plan = lower(kernel)
            g = plan.schedule.gemms[0]
            made = dict(source_name="bench.kg", source_hash="", command="bench/epilogue_tile.py")
            source = emit(plan, **made)
            if variant.endswith("no C prefetch"):
                assert PREFETCH_LINE in source or g.staged.param is None, variant
                source = source.replace(PREFETCH_LINE, "")
            built = Built(kernel, plan, source, emit_header(plan, **made))
            compiled[label, variant] = (kernel, kgen.api.load_built(built))
            print(f"{label:26s} {variant:17s} stages {g.pipeline.stages} "
                  f"store {g.output.path.name} stages_d {g.staging.boxes} "
                  f"staged input {g.staged.param} vectors {g.vectors.held(VectorHome.STAGED)} "
                  f"smem {plan.smem_bytes}")
    rows = []
    for text in opts.sizes:
        m, n, k = (int(x) for x in text.split(","))
        sizes = dict(M=m, N=n, K=k)
        flops = 2 * m * n * k
        for label, dt, expr, reference, unfused in chosen:
            kernel0 = compiled[label, next(iter(VARIANTS))][0]
            set_bytes = 2 * (m * k + n * k + 2 * m * n)
            rotate = rotation_count(set_bytes, l2)
            sets = [make_inputs(torch, kernel0, sizes) for _ in range(max(2, rotate))]
            names = {p.name for p in kernel0.params}
            args = [{q: s[q] for q in s if q in names} for s in sets]
            runs = {}
            for variant in VARIANTS:
                kernel, c = compiled[label, variant]
                err = check(torch, c, kernel, args[0],
                            lambda **a: reference(a["A"].float() @ a["B"].float(), a))
                outs = [{q.name: alloc(torch, q, sizes) for q in kernel.params
                         if q.role is ir.Role.OUT} for _ in sets]
                runs[variant] = ([c.bind(**a, **o) for a, o in zip(args, outs)], c, err)

            def timed(fn):
                return time_kernel(fn, iters=30, warmup=5, rotate=rotate, stream=stream).median_ms

            times = {name: [] for name in ["matmul", *(["unfused"] if unfused else []), *runs]}
            for _ in range(opts.rounds):
                times["matmul"].append(timed(lambda i: torch.matmul(args[i % len(args)]["A"],
                                                                    args[i % len(args)]["B"])))
                if unfused:
                    times["unfused"].append(timed(lambda i: unfused(torch, args[i % len(args)])))
                for variant, (bound, c, _) in runs.items():
                    times[variant].append(timed(lambda i: c.launch(bound[i % len(bound)], stream)))
            mm = min(times["matmul"])
            print(f"\n{label} {dt} {m}x{n}x{k} | torch.matmul {mm:.4f} ms "
                  f"({flops / mm / 1e9:.0f} TFLOP/s)")
            for name, ts in times.items():
                t = min(ts)
                err = runs[name][2] if name in runs else 0.0
                row = dict(kernel=label, dtype=dt, shape=[m, n, k], variant=name, ms=t,
                           samples=ts, matmul_ms=mm, time_x_matmul=t / mm,
                           x_unfused=(min(times["unfused"]) / t) if unfused else None,
                           peak_fraction=flops / t / 1e9 / PEAK_TFLOPS, rel_err=err)
                rows.append(row)
                extra = f", {row['x_unfused']:.2f}x unfused" if unfused and name in runs else ""
                print(f"  {name:17s} {t:.4f} ms ({', '.join(f'{x:.4f}' for x in ts)}) "
                      f"{row['time_x_matmul']:.3f}x matmul's time{extra}, "
                      f"{100 * row['peak_fraction']:.0f}% of peak; err {err:.1e}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(device=props.name, date=time.strftime(
            "%Y-%m-%d"), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
