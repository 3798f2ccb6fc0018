"""Issue 16's column-major outputs at full speed on sm_80 code (mma.sync, cp.async; run on an
H100/H200, which runs sm_80 code): kgen's tiled GEMM writing D row-major (pairs) and
column-major, the latter as two Schedule values of one plan: 16-byte chunks of 8 rows
(movmatrix + quad transpose, StorePath.WIDE, what kgen now plans) and element stores
(StorePath.PAIRS, what every sm_80 column-major output did before). A bare `D = acc` and a
fused `relu(alpha*acc + C + bias[col])` with C in D's layout; torch.matmul beside them. Every
kernel is first checked against a float32 reference with its outputs poisoned; CUDA events,
the median of 30, inputs rotated past L2 (bench/hopper_gemm.py's helpers).

    bash .gpu/device-run.sh python3 bench/sm80_col_output.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hopper_gemm import alloc, check, make_inputs  # noqa: E402

KERNEL = """
kernel {name} {{
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  {c}
  tensor D : f16[M, N] {layout} out
  {bias}
  gemm g = A @ B accumulate f32 {{
    epilogue {{ D = {epilogue} }}
  }}
}}
"""


def kernel_text(layout, fused):
    if fused:
        return KERNEL.format(name=f"fused_{layout}", layout=layout,
                             c=f"tensor C : f16[M, N] {layout}", bias="vector bias : f32[N]",
                             epilogue="relu(1.5 * acc + C + bias[col])")
    return KERNEL.format(name=f"bare_{layout}", layout=layout, c="", bias="", epilogue="acc")


def with_store(plan, store):
    """The same plan with its output's store path replaced (a Schedule value)."""
    s = plan.schedule
    g = dataclasses.replace(s.gemms[0], store=store)
    return dataclasses.replace(plan, schedule=dataclasses.replace(s, gemms=(g,)))


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import Built
    from kgen.emit import emit
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.lower import lower
    from kgen.parse import parse
    from kgen.plan import StorePath
    from kgen.verify import verify

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

    cases = [((4096, 4096, 4096), False), ((8192, 8192, 1024), False),
             ((4096, 4096, 512), False), ((8192, 8192, 1024), True),
             ((6144, 5120, 768), True), ((2048, 8192, 256), True)]
    for (m, n, k), fused in cases:
        sizes = dict(M=m, N=n, K=k)
        flops = 2 * m * n * k
        set_bytes = 2 * (m * k + n * k + m * n * (2 if fused else 1))
        nsets = 2 if set_bytes > l2 else rotation_count(set_bytes, l2)
        probe = parse(kernel_text("row", fused), "k.kg").kernels[0]
        sets = [make_inputs(torch, probe, sizes) for _ in range(nsets)]
        matmul = timed(lambda i: torch.matmul(sets[i % nsets]["A"], sets[i % nsets]["B"]),
                       set_bytes)
        tag = f"{'relu(1.5*acc+C+bias)' if fused else 'gemm'} f16 {m}x{n}x{k}"
        print(f"\n{tag} | matmul {matmul:.4f} ms", flush=True)
        for layout in ("row", "col"):
            module = parse(kernel_text(layout, fused), "k.kg")
            verify(module)
            kernel = module.kernels[0]
            layout_sets = [dict(s) for s in sets]
            if fused and layout == "col":
                for s in layout_sets:
                    s["C"] = s["C"].t().contiguous().t()

            def reference(A, B, C=None, bias=None):
                acc = A.float() @ B.float()
                return acc if C is None else torch.relu(1.5 * acc + C.float() + bias)

            plan = lower(kernel)
            stores = [plan.schedule.gemms[0].store]
            if layout == "col":
                stores.append(StorePath.PAIRS)
            for store in stores:
                variant = with_store(plan, store)
                source = emit(variant, source_name="k.kg", source_hash="", command="bench")
                compiled = kgen.api.load_built(Built(kernel, variant, source, ""))
                err = check(torch, compiled, kernel, layout_sets[0], reference)
                outs = [{p.name: alloc(torch, p, sizes) for p in kernel.params
                         if p.role is ir.Role.OUT} for _ in layout_sets]
                bound = [compiled.bind(**s, **o) for s, o in zip(layout_sets, outs)]
                assert not bound[0].narrow, bound[0].narrow
                t = timed(lambda i: compiled.launch(bound[i % len(bound)], stream), set_bytes)
                g = plan.gemms[0]
                row = dict(tag=tag, layout=layout, store=store.value, shape=[m, n, k], ms=t,
                           tflops=flops / t / 1e9, rel_err=err, matmul_ms=matmul,
                           vs_matmul=matmul / t, tile=list(g.tile), stages=g.stages)
                rows.append(row)
                print(f"  D {layout}-major, {store.value:16s} tile {g.tile} s{g.stages}: "
                      f"{t:.4f} ms {row['tflops']:5.0f} TFLOP/s {row['vs_matmul']:.3f}x matmul; "
                      f"err {err:.1e}", flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
