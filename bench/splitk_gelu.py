"""Issue 16's table on a GPU: D = gelu(A @ B + bias[col]) fused by kgen against PyTorch unfused
(matmul, add, gelu) for M in {1, 16, 128, 4096} and (N, K) in {(4096, 4096), (11008, 4096),
(4096, 11008)}, plus 64x64x65536 for split-K, all f16.

Each shape runs a few schedules, each a Schedule value of examples/splitk_gelu.kg (the
sm_90a cooperative default, tiled kernels of two tile shapes with split 1, 2, 4 and 8, and, for
an output of at most 65,536 elements, a 64x64 tile with split 16, 32 and 64): the
best is what `kgen tune` would choose (that command is the tuning issue's), the default is what
the example runs without tuning. Timing as bench/hopper_gemm.py (CUDA events, the median,
inputs rotated past L2); each schedule first checked against a float32 reference with its output
poisoned.

    bash .gpu/device-run.sh python3 bench/splitk_gelu.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hopper_gemm import alloc, check, device_setup, make_inputs  # noqa: E402

SHAPES = [(m, n, k) for m in (1, 16, 128, 4096)
          for n, k in ((4096, 4096), (11008, 4096), (4096, 11008))] + [(64, 64, 65536)]


def variants(kernel, ir):
    """(label, kernel): the schedules measured, as Schedule values of one kernel."""
    g = kernel.gemms[0]

    def with_(arch, tile, warps, stages, split):
        gemm = dataclasses.replace(
            g, tile=ir.TileShape(*tile, loc=g.tile.loc), warps=ir.WarpGrid(*warps, loc=g.warps.loc),
            stages=ir.StageCount(stages, loc=g.stages.loc),
            split=ir.SplitK(split) if split > 1 else None)
        return dataclasses.replace(kernel, gemms=(gemm,), target=arch)

    out = [("cooperative 128x256 s3 (default)",
            with_(ir.Arch.SM90A, (128, 256, 64), (2, 4), 3, 1))]
    for tile, warps, stages in (((64, 128, 64), (2, 2), 4), ((32, 128, 64), (1, 4), 4)):
        for split in (1, 2, 4, 8):
            label = f"tiled {tile[0]}x{tile[1]} split {split}"
            out.append((label, with_(ir.Arch.SM90A, tile, warps, stages, split)))
    # deep splits for a tiny output and a very long K (their workspace is split x M x N floats)
    for split in (16, 32, 64):
        out.append((f"tiled 64x64 split {split}", with_(ir.Arch.SM90A, (64, 64, 64), (2, 2), 4,
                                                        split)))
    return out


def deep(label: str) -> bool:
    return label.startswith("tiled 64x64")


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
    kernel = parse_file(ROOT / "examples/splitk_gelu.kg").kernels[0]
    compiled = {}
    for label, variant in variants(kernel, ir):
        compiled[label] = kgen.api.load_built(build(variant))
    rows = []

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    def unfused(A, B, bias):
        return torch.nn.functional.gelu(torch.matmul(A, B) + bias)

    def reference(A, B, bias):
        return torch.nn.functional.gelu(A.float() @ B.float() + bias)

    best_ratios, default_ratios = [], []
    for m, n, k in SHAPES:
        sizes = dict(M=m, N=n, K=k)
        set_bytes = 2 * (m * k + n * k + m * n) + 4 * n
        sets = [make_inputs(torch, kernel, sizes)
                for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
        t_unfused = timed(lambda i: unfused(**sets[i % len(sets)]), set_bytes)
        t_matmul = timed(lambda i: torch.matmul(sets[i % len(sets)]["A"], sets[i % len(sets)]["B"]),
                         set_bytes)
        print(f"\n{m}x{n}x{k} | unfused {t_unfused:.4f} ms | matmul {t_matmul:.4f} ms")
        timings = {}
        for label, k_ in compiled.items():
            if deep(label) and m * n > 1 << 16:
                continue  # a deep split only where the output is small
            err = check(torch, k_, kernel, sets[0], reference)
            outs = [{"D": alloc(torch, kernel.param("D"), sizes)} for _ in sets]
            bound = [k_.bind(**s, **o) for s, o in zip(sets, outs)]
            t = timed(lambda i: k_.launch(bound[i % len(bound)], stream), set_bytes)
            ok = err < 1e-2
            timings[label] = t if ok else math.inf
            print(f"  {label:34s} {t:.4f} ms {t_unfused / t:5.2f}x unfused "
                  f"{t_matmul / t:5.2f}x matmul; err {err:.1e}{'' if ok else ' WRONG'}")
            rows.append(dict(shape=[m, n, k], variant=label, ms=t, rel_err=err,
                             torch_unfused_ms=t_unfused, torch_matmul_ms=t_matmul,
                             vs_unfused=t_unfused / t, vs_matmul=t_matmul / t))
        best = min(timings, key=timings.get)
        default = next(iter(compiled))
        best_ratios.append(t_unfused / timings[best])
        default_ratios.append(t_unfused / timings[default])
        print(f"  best: {best} at {t_unfused / timings[best]:.2f}x unfused; default "
              f"{t_unfused / timings[default]:.2f}x")
        rows.append(dict(shape=[m, n, k], best=best, best_vs_unfused=best_ratios[-1],
                         default_vs_unfused=default_ratios[-1]))

    def geomean(values):
        return math.exp(sum(math.log(v) for v in values) / len(values))

    print(f"\ngeomean x unfused: best {geomean(best_ratios):.3f} (min {min(best_ratios):.2f}); "
          f"default {geomean(default_ratios):.3f} (min {min(default_ratios):.2f})")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
