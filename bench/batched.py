"""Batches on a GPU: examples/batched_gemm_bias.kg (D[b] = alpha * A[b] @ B[b] + bias[b]) for
the sm_80 and the sm_90a code, beside torch.bmm (the bare batched product), torch.matmul with a
broadcast B, and the unfused PyTorch epilogue, and the example with its schedule lines left to
kgen (`sized`: kgen.load's per-call choice for the sizes), at batch counts and shapes where a
batched GEMM is what a user runs (many small matrices, a few large ones, a broadcast weight,
odd sizes).
Timing as bench/hopper_gemm.py (CUDA events, the median, inputs rotated past L2); every kernel
first checked against a float32 reference with its outputs poisoned.

    bash .gpu/device-run.sh python3 bench/batched.py [--json OUT.json] [--quick]
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

from hopper_gemm import PEAK_TFLOPS, device_setup  # noqa: E402

# (L, M, N, K, broadcast B, what the shape exercises)
SHAPES = [
    (8, 4096, 4096, 1024, False, "a few large matrices"),
    (64, 1024, 1024, 512, False, "many medium matrices"),
    (512, 256, 256, 128, False, "many small matrices (attention-sized)"),
    (4096, 64, 128, 64, False, "thousands of tiny matrices"),
    (16, 2048, 4096, 4096, True, "a weight shared by every batch (B stride 0)"),
    (17, 1000, 1000, 100, False, "odd batch count, tails, narrow entry point (K = 100)"),
    (3, 4097, 129, 72, False, "odd N: the narrow epilogue"),
]
QUICK = [SHAPES[0], SHAPES[2], SHAPES[4]]


def inputs(torch, L, M, N, K, broadcast_b):
    a = torch.randn(L, M, K, device="cuda").half() / K ** 0.5
    b_one = torch.randn(N, K, device="cuda").half().t()  # [K, N] column-major
    b = b_one.expand(L, K, N) if broadcast_b else \
        torch.randn(L, N, K, device="cuda").half().transpose(1, 2)
    bias = torch.randn(L, N, device="cuda")
    return dict(A=a, B=b, bias=bias)


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import build
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse_file
    from kgen.tune.space import free_lines

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    props, stream, l2 = device_setup(torch)
    kernel = parse_file(ROOT / "examples/batched_gemm_bias.kg").kernels[0]
    alpha = 0.75
    compiled = {}
    for arch in (ir.Arch.SM80, ir.Arch.SM90A):
        built = build(dataclasses.replace(kernel, target=arch))
        started = time.perf_counter()
        compiled[arch.value] = (arch, built, kgen.api.load_built(built),
                                time.perf_counter() - started)
    # the example with its schedule lines left to kgen: kgen.load picks, per call, what the
    # sizes call for (kgen/lower/builder.py's `sized`)
    free = free_lines(dataclasses.replace(kernel, target=ir.Arch.SM90A))
    compiled["sized"] = (ir.Arch.SM90A, build(free), kgen.load(free, "sm_90a"), 0.0)

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=20, warmup=3, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    rows = []
    for L, M, N, K, broadcast_b, what in (QUICK if opts.quick else SHAPES):
        b_bytes = 2 * K * N * (1 if broadcast_b else L)
        set_bytes = 2 * L * M * K + b_bytes + 2 * L * M * N + 4 * L * N
        sets = [inputs(torch, L, M, N, K, broadcast_b)
                for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
        outs = [torch.empty(L, M, N, device="cuda", dtype=torch.float16) for _ in sets]
        torch_fns = {
            "bmm": lambda i: torch.bmm(sets[i % len(sets)]["A"], sets[i % len(sets)]["B"]),
            "matmul": lambda i: torch.matmul(sets[i % len(sets)]["A"],
                                             sets[i % len(sets)]["B"]),
            "unfused": lambda i: torch.add(
                alpha * torch.matmul(sets[i % len(sets)]["A"], sets[i % len(sets)]["B"]),
                sets[i % len(sets)]["bias"][:, None, :]),
        }
        base = {name: timed(fn, set_bytes) for name, fn in torch_fns.items()}
        flops = 2 * L * M * N * K
        print(f"\nL={L} {M}x{N}x{K}{' B broadcast' if broadcast_b else ''} ({what})"
              + "".join(f" | {name} {t:.4f} ms" for name, t in base.items()))
        first = sets[0]
        want = alpha * (first["A"].float() @ first["B"].float()) + first["bias"][:, None, :]
        for label, (arch, built, k, compile_s) in compiled.items():
            if arch is ir.Arch.SM90A and torch.cuda.get_device_capability() != (9, 0):
                continue
            d = torch.full((L, M, N), float("nan"), device="cuda", dtype=torch.float16)
            k(**first, D=d, alpha=alpha)
            torch.cuda.synchronize()
            err = ((d.float() - want).norm() / want.norm()).item()
            if not torch.isfinite(d).all():
                err = float("inf")
            bound = [k.bind(**s, D=o, alpha=alpha) for s, o in zip(sets, outs)]
            t = timed(lambda i: k.launch(bound[i % len(bound)], stream), set_bytes)
            entry = "narrow" if bound[0].narrow else "fast"
            plan = k.variant(bound[0].sizes).plan if label == "sized" else built.plan
            scheduler = plan.schedule.scheduler
            kind = scheduler.kind.value + " " + "x".join(map(str, plan.gemms[0].tile)) + (
                f" split {scheduler.split_k}" if scheduler.split_k > 1 else "")
            row = dict(shape=[L, M, N, K], broadcast_b=broadcast_b, what=what, arch=label,
                       entry=entry, why_narrow=bound[0].narrow,
                       kind=kind, ms=t, tflops=flops / t / 1e9,
                       peak_fraction=flops / t / 1e9 / PEAK_TFLOPS, rel_err=err,
                       compile_s=compile_s, vs_bmm=base["bmm"] / t,
                       vs_matmul=base["matmul"] / t, vs_unfused=base["unfused"] / t,
                       **{f"torch_{name}_ms": v for name, v in base.items()})
            rows.append(row)
            print(f"  {label:6s} {entry:6s} {t:.4f} ms {row['tflops']:5.0f} TFLOP/s "
                  f"{row['vs_bmm']:.3f}x bmm, {row['vs_unfused']:.2f}x unfused; err {err:.1e}; "
                  f"{row['kind']}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
