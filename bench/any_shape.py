"""Issue 16 on a GPU: the fast entry point at aligned shapes (no slower than before the narrow
entry point existed) and the narrow one at shapes that miss its rules, for the sm_80 and the
sm_90a code, beside torch.matmul and the unfused PyTorch epilogue. Timing as bench/hopper_gemm.py
(CUDA events, the median, inputs rotated past L2); every kernel first checked against a float32
reference with its outputs poisoned.

    bash .gpu/device-run.sh python3 bench/any_shape.py [--json OUT.json]
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

# (M, N, K, what the shape exercises)
SHAPES = [
    (4096, 4096, 4096, "aligned: the fast entry point"),
    (4096, 11008, 4096, "aligned: the fast entry point"),
    (4096, 4095, 4096, "odd N: narrow epilogue, 16-byte operand copies"),
    (4096, 4090, 4096, "N % 8 = 2: narrow, 16-byte operand copies"),
    (4096, 4096, 4092, "K % 8 = 4: narrow, 8-byte copies"),
    (4096, 4096, 4094, "K % 8 = 6: narrow, 4-byte copies"),
    (4096, 4096, 4095, "odd K: narrow, element copies"),
    (1000, 1000, 100, "the issue's 1000x1000x100"),
]


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import build
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse_file

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    props, stream, l2 = device_setup(torch)
    rows = []

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=20, warmup=3, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    bias_relu = parse_file(ROOT / "examples/gemm_bias_relu.kg").kernels[0]
    cases = [
        ("gemm f16", _plain(bias_relu, ir), {"matmul": lambda A, B: torch.matmul(A, B)},
         lambda A, B: A.float() @ B.float()),
        ("relu(alpha*acc+beta*C+bias)", bias_relu,
         {"matmul": lambda A, B, C, bias: torch.matmul(A, B),
          "unfused": lambda A, B, C, bias: torch.relu(1.5 * torch.matmul(A, B) + 0.5 * C + bias)},
         lambda A, B, C, bias: torch.relu(1.5 * (A.float() @ B.float()) + 0.5 * C.float() + bias)),
    ]
    for tag, kernel, torch_fns, reference in cases:
        for m, n, k, what in SHAPES:
            sizes = dict(M=m, N=n, K=k)
            set_bytes = 2 * (m * k + n * k + 2 * m * n)
            sets = [make_inputs(torch, kernel, sizes)
                    for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
            base = {name: timed(lambda i, fn=fn: fn(**sets[i % len(sets)]), set_bytes)
                    for name, fn in torch_fns.items()}
            flops = 2 * m * n * k
            print(f"\n{tag} {m}x{n}x{k} ({what})" + "".join(
                f" | {name} {t:.4f} ms" for name, t in base.items()))
            for arch in (ir.Arch.SM80, ir.Arch.SM90A):
                built = build(dataclasses.replace(kernel, target=arch))
                started = time.perf_counter()
                compiled = kgen.api.load_built(built)
                compile_s = time.perf_counter() - started
                err = check(torch, compiled, kernel, sets[0], reference)
                outs = [{p.name: alloc(torch, p, sizes) for p in kernel.params
                         if p.role is ir.Role.OUT} for _ in sets]
                bound = [compiled.bind(**s, **o) for s, o in zip(sets, outs)]
                t = timed(lambda i: compiled.launch(bound[i % len(bound)], stream), set_bytes)
                entry = "narrow" if bound[0].narrow else "fast"
                row = dict(tag=tag, shape=[m, n, k], what=what, arch=arch.value, entry=entry,
                           why_narrow=bound[0].narrow,
                           kind=built.plan.schedule.scheduler.kind.value, ms=t,
                           tflops=flops / t / 1e9, peak_fraction=flops / t / 1e9 / PEAK_TFLOPS,
                           rel_err=err, compile_s=compile_s,
                           vs_matmul=base["matmul"] / t,
                           **{f"torch_{name}_ms": v for name, v in base.items()})
                if "unfused" in base:
                    row["vs_unfused"] = base["unfused"] / t
                rows.append(row)
                extra = f", {row['vs_unfused']:.2f}x unfused" if "unfused" in base else ""
                print(f"  {arch.value:6s} {entry:6s} {t:.4f} ms {row['tflops']:5.0f} TFLOP/s "
                      f"{row['vs_matmul']:.3f}x matmul{extra}; err {err:.1e}; "
                      f"{row['kind']}; compile {compile_s:.2f} s")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


def _plain(kernel, ir):
    """The bias-relu kernel's mainloop with the plain store D = acc (A, B, D only)."""
    g = kernel.gemms[0]
    gemm = dataclasses.replace(g, epilogue=ir.Epilogue((ir.Store("D", ir.Acc()),)))
    params = tuple(p for p in kernel.params if p.name in ("A", "B", "D"))
    return dataclasses.replace(kernel, name="gemm_f16", params=params, gemms=(gemm,))


if __name__ == "__main__":
    sys.exit(main())
