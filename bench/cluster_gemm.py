"""Thread-block clusters with TMA multicast on the warp-specialized sm_90a GEMM (issue 15), on an
H100/H200, in one process: bf16 and f16 GEMM at 4096^3, 8192^3 and 8192x8192x512, each on the
default tiles (cooperative 128x256 s3, ping-pong 128x128 s5) with cluster 1x1, 2x1 (B multicast)
and 1x2 (A multicast), beside torch.matmul on the same inputs. Timed as bench/hopper_gemm.py
does (CUDA events around each run, the median of 30, inputs rotated past L2); every kgen kernel
is first checked against a float32 PyTorch reference with its outputs poisoned (NaN).

    bash .gpu/device-run.sh python3 bench/cluster_gemm.py [--json OUT.json] [--quick]
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

from bench.hopper_gemm import (  # noqa: E402
    PEAK_TFLOPS, alloc, check, device_setup, make_inputs, retyped)

CLUSTERS = ((1, 1), (2, 1), (1, 2))


def variants(kernel, ir):
    """(label, kernel): each default tile with each cluster, as Schedule values."""
    g = kernel.gemms[0]
    out = []
    for label, schedule, tile, stages in (("cooperative 128x256 s3", None, (128, 256, 64), 3),
                                          ("pingpong 128x128 s5", ir.Schedule.PINGPONG,
                                           (128, 128, 64), 5)):
        for cm, cn in CLUSTERS:
            gemm = dataclasses.replace(g, tile=ir.TileShape(*tile, loc=g.tile.loc),
                                       stages=ir.StageCount(stages, loc=g.stages.loc),
                                       cluster=ir.ClusterShape(cm, cn))
            out.append((f"{label} cluster {cm}x{cn}",
                        dataclasses.replace(kernel, gemms=(gemm,), schedule=schedule,
                                            target=ir.Arch.SM90A)))
    return out


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import build
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse_file

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    props, stream, l2 = device_setup(torch)
    rows = []

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    gemm = parse_file(ROOT / "examples/gemm.kg").kernels[0]
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 512)]
    if opts.quick:
        shapes = shapes[:1]
    for dtype in (ir.DType.BF16, ir.DType.F16):
        kernel = retyped(gemm, dtype, ir)
        for m, n, k in shapes:
            sizes = dict(M=m, N=n, K=k)
            flops = 2 * m * n * k
            set_bytes = 2 * (m * k + n * k + m * n)
            sets = [make_inputs(torch, kernel, sizes)
                    for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
            base = timed(lambda i: torch.matmul(sets[i % len(sets)]["A"], sets[i % len(sets)]["B"]),
                         set_bytes)
            print(f"\ngemm {dtype.dsl_name} {m}x{n}x{k} | matmul {base:.4f} ms "
                  f"({flops / base / 1e9:.0f} TFLOP/s)")
            for label, variant in variants(kernel, ir):
                try:
                    built = build(variant)
                    started = time.perf_counter()
                    compiled = kgen.api.load_built(built)
                    compile_s = time.perf_counter() - started
                except Exception as err:  # a refused or failed variant is a result too
                    print(f"  {label:36s} not built: {str(err).splitlines()[0][:120]}")
                    continue
                err = check(torch, compiled, kernel, sets[0], lambda A, B: A.float() @ B.float())
                outs = [{p.name: alloc(torch, p, sizes) for p in kernel.params
                         if p.role is ir.Role.OUT} for _ in sets]
                bound = [compiled.bind(**s, **o) for s, o in zip(sets, outs)]
                t = timed(lambda i: compiled.launch(bound[i % len(bound)], stream), set_bytes)
                s = built.plan.schedule
                row = dict(dtype=dtype.dsl_name, variant=label, kind=s.scheduler.kind.value,
                           cluster=list(s.scheduler.cluster.shape), multicast=s.multicast,
                           shape=[m, n, k],
                           grid=bound[0].grid[0], ms=t, tflops=flops / t / 1e9,
                           peak_fraction=flops / t / 1e9 / PEAK_TFLOPS, rel_err=err,
                           compile_s=compile_s, torch_matmul_ms=base, vs_matmul=base / t)
                rows.append(row)
                print(f"  {label:36s} {t:.4f} ms {row['tflops']:5.0f} TFLOP/s "
                      f"{row['vs_matmul']:.3f}x matmul; err {err:.1e}; grid {row['grid']}; "
                      f"multicast {s.multicast}; compile {compile_s:.2f} s")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
