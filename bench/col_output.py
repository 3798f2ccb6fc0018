"""Issue 16's column-major outputs at full speed, on an H100/H200, in one process: kgen's
sm_90a warp-specialized GEMM writing D row-major and column-major, each as two Schedule values
of the same kernel: cooperative 128x256 with 3 stages (the output staged and stored by the copy
engine; column-major: staged transposed by stmatrix .trans) and with 4 stages (the staging no
longer fits beside the ring: pairs from registers, column-major ones as two element stores each,
which is how every column-major output left before). torch.matmul (row-major) beside them. Every
kernel is first checked against a float32 reference with its outputs poisoned; CUDA events, the
median of 30, inputs rotated past L2 (bench/hopper_gemm.py's helpers).

    bash .gpu/device-run.sh python3 bench/col_output.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hopper_gemm import PEAK_TFLOPS, alloc, check, make_inputs  # noqa: E402

KERNEL = """
kernel {name} {{
  target sm_90a
  tensor A : {dtype}[M, K] row
  tensor B : {dtype}[K, N] col
  {c}
  tensor D : {dtype}[M, N] {layout} out
  {bias}
  gemm g = A @ B accumulate f32 {{
    tile 128x256x64  warps 2x4  stages 3
    epilogue {{ D = {epilogue} }}
  }}
}}
"""


def kernel_text(dtype, layout, with_c):
    if with_c:  # the own fused kernel: C in the output's layout, staged with it
        return KERNEL.format(name=f"col_c_{layout}", dtype=dtype, layout=layout,
                             c=f"tensor C : {dtype}[M, N] {layout}", bias="vector bias : f32[N]",
                             epilogue="relu(acc + 0.5 * C + bias[col])")
    return KERNEL.format(name=f"col_{layout}", dtype=dtype, layout=layout, c="", bias="",
                         epilogue="acc")


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import build
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__)
    stream = torch.cuda.current_stream().cuda_stream
    rows = []

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    cases = [("f16", (8192, 8192, 8192), False), ("bf16", (4096, 4096, 4096), False),
             ("bf16", (6144, 5120, 3072), False), ("f16", (4096, 11008, 4096), True)]
    for dtype, (m, n, k), with_c in cases:
        sizes = dict(M=m, N=n, K=k)
        flops = 2 * m * n * k
        set_bytes = 2 * (m * k + n * k + m * n * (2 if with_c else 1))
        nsets = 2 if set_bytes > l2 else rotation_count(set_bytes, l2)
        probe = parse(kernel_text(dtype, "row", with_c), "k.kg").kernels[0]
        sets = [make_inputs(torch, probe, sizes) for _ in range(nsets)]
        matmul = timed(lambda i: torch.matmul(sets[i % nsets]["A"], sets[i % nsets]["B"]),
                       set_bytes)
        tag = f"{'own: relu(acc+0.5*C+bias)' if with_c else 'gemm'} {dtype} {m}x{n}x{k}"
        print(f"\n{tag} | matmul {matmul:.4f} ms ({flops / matmul / 1e9:.0f} TFLOP/s)")
        for layout in ("row", "col"):
            kernel = parse(kernel_text(dtype, layout, with_c), "k.kg").kernels[0]
            # C in the output's layout: the same values, stored the kernel's way
            layout_sets = [dict(s) for s in sets]
            if with_c and layout == "col":
                for s in layout_sets:
                    s["C"] = s["C"].t().contiguous().t()

            def reference(A, B, C=None, bias=None):
                acc = A.float() @ B.float()
                return acc if C is None else torch.relu(acc + 0.5 * C.float() + bias)

            for stages in (3, 4):
                g = kernel.gemms[0]
                variant = dataclasses.replace(kernel, gemms=(dataclasses.replace(
                    g, stages=ir.StageCount(stages, loc=g.stages.loc)),))
                built = build(variant)
                compiled = kgen.api.load_built(built)
                err = check(torch, compiled, kernel, layout_sets[0], reference)
                outs = [{p.name: alloc(torch, p, sizes) for p in kernel.params
                         if p.role is ir.Role.OUT} for _ in layout_sets]
                bound = [compiled.bind(**s, **o) for s, o in zip(layout_sets, outs)]
                t = timed(lambda i: compiled.launch(bound[i % len(bound)], stream), set_bytes)
                store = built.plan.schedule.gemms[0].output.path.value
                row = dict(tag=tag, own=with_c or (m, n, k) == (6144, 5120, 3072),
                           layout=layout, stages=stages, store=store, shape=[m, n, k], ms=t,
                           tflops=flops / t / 1e9, peak_fraction=flops / t / 1e9 / PEAK_TFLOPS,
                           rel_err=err, matmul_ms=matmul, vs_matmul=matmul / t)
                rows.append(row)
                print(f"  D {layout}-major, cooperative 128x256 s{stages} ({store:22s}) "
                      f"{t:.4f} ms {row['tflops']:5.0f} TFLOP/s ({100 * row['peak_fraction']:.0f}% "
                      f"of peak) {row['vs_matmul']:.3f}x matmul; err {err:.1e}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
