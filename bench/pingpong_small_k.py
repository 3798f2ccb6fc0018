"""Ping-pong against the cooperative kernel at a short runtime K, on an H100/H200: with few k
tiles per output tile the cooperative kernel's epilogue (both consumers, tensor cores idle)
weighs more, and ping-pong runs one consumer's epilogue under the other's mainloop. Each
variant a Schedule value (a Config), checked against the reference with its output poisoned,
timed with CUDA events (median of 30, inputs rotated past L2), beside torch.matmul (the bare
GEMM) or the unfused PyTorch (the fused epilogues).

    bash .gpu/device-run.sh python3 bench/pingpong_small_k.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE, kgen_run, label  # noqa: E402
from staged_late import RESIDUAL  # noqa: E402

CASES = [  # (kernel, M, N, K); own shapes and a kernel of my own marked
    ("bare", 8192, 8192, 512), ("bare", 16384, 1024, 1024), ("bare", 4096, 4096, 1024),
    ("bare", 8192, 8192, 1024), ("own residual", 8192, 8192, 1024),
    ("own residual", 6144, 5120, 768), ("own residual", 4096, 4096, 512),
    ("gemm_bias_relu", 8192, 8192, 1024),
]


def main() -> int:
    import torch

    from kgen import ir
    from kgen.parse import parse, parse_file
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig
    from kgen.tune.space import free_lines

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    torch.manual_seed(0)
    kernels = {"bare": parse(BARE.format(t="f16"), "bare.kg").kernels[0],
               "own residual": parse(RESIDUAL, "residual.kg").kernels[0],
               "gemm_bias_relu": free_lines(parse_file(ROOT / "examples/gemm_bias_relu.kg")
                                            .kernels[0])}
    variants = [("sized", None),
                ("pingpong s5", Config((GemmConfig((128, 128, 64), (2, 4), 5),),
                                       KernelKind.PINGPONG)),
                ("pingpong s4", Config((GemmConfig((128, 128, 64), (2, 4), 4),),
                                       KernelKind.PINGPONG))]
    print("device", torch.cuda.get_device_name())
    rows = []
    for name, m, n, k in CASES:
        sizes = dict(M=m, N=n, K=k)
        row = dict(kernel=name, m=m, n=n, k=k, variants={})
        for vname, config in variants:
            report, plan = kgen_run(kernels[name], sizes, ir.Arch.SM90A,
                                    torch_baseline=not row["variants"], config=config)
            if not row["variants"]:
                row["torch_ms"] = report.torch_timing.median_ms
            row["variants"][vname] = dict(ms=report.timing.median_ms, ok=report.ok,
                                          schedule=label(plan),
                                          x_torch=row["torch_ms"] / report.timing.median_ms)
        rows.append(row)
        base = "matmul" if name == "bare" else "unfused"
        print(f"{name} {m}x{n}x{k}: {base} {row['torch_ms']:.4f} ms | " + "  ".join(
            f"{v} {r['x_torch']:.3f}x ({r['schedule']})" + ("" if r["ok"] else " CHECK FAILED")
            for v, r in row["variants"].items()))
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(date=time.strftime("%Y-%m-%d"), rows=rows),
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
