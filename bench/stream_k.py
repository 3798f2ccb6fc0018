"""Stream-K on the cooperative wgmma kernel (`split stream`, issues 16 and 17), on an H100/H200:
each variant a Schedule value (a Config the builder fills in) against the runtime sizes' choice
(`sized`: what kgen run and kgen.load take untuned) and PyTorch.

    bare   f16 D = acc: the sweep's shapes of at most about two waves of 128x256 tiles, shapes
           of my own that no rule was tuned on, and two of many waves (the cost of stream-K
           where the tiles already fill the SMs); x torch.matmul
    fused  relu(alpha acc + beta C + bias[col]) (examples/gemm_bias_relu.kg) and
           gelu(acc + bias[col]) (examples/splitk_gelu.kg); x PyTorch unfused

Every variant is checked against the reference with its output poisoned (kgen.harness.run)
before it is timed: CUDA events, the median of 30, inputs rotated past L2.

    bash .gpu/device-run.sh python3 bench/stream_k.py [--json OUT.json] [--part bare fused]
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

from defaults import BARE, kgen_run, label  # noqa: E402

# the sweep's (bench/defaults.py) shapes below 1.0x matmul with the sized choice, then my own
SWEEP_FEW = [(1024, 1024, 1024), (2048, 2048, 2048), (128, 4096, 4096), (1536, 1536, 6144),
             (512, 8192, 8192)]
OWN = [(768, 3072, 4096), (1792, 2304, 3072), (3000, 1000, 8000), (640, 1280, 12288),
       (2304, 1536, 1536)]
MANY = [(4096, 4096, 4096), (6144, 5120, 3072)]


def variants():
    from kgen.targets import Config, GemmConfig

    def stream(tile, stages):
        return Config((GemmConfig(tile, (2, 4), stages, stream=True),))
    return [("sized", "sized"), ("stream 128x128 s5", stream((128, 128, 64), 5)),
            ("stream 128x192 s4", stream((128, 192, 64), 4)),
            ("stream 128x256 s3", stream((128, 256, 64), 3))]


def run_rows(kernel, shapes, tag, baseline_key):
    from kgen import ir

    rows = []
    for m, n, k in shapes:
        sizes = dict(M=m, N=n, K=k)
        row = dict(m=m, n=n, k=k, tag=tag, variants={})
        for name, config in variants():
            report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A,
                                    torch_baseline="torch_ms" not in row,
                                    config=None if config == "sized" else config,
                                    sized=config == "sized")
            if "torch_ms" not in row:
                row["torch_ms"] = report.torch_timing.median_ms
            row["variants"][name] = dict(ms=report.timing.median_ms, ok=report.ok,
                                         schedule=label(plan),
                                         ratio=row["torch_ms"] / report.timing.median_ms)
        best = max(row["variants"], key=lambda v: row["variants"][v]["ratio"])
        row["best"] = best
        rows.append(row)
        shown = "  ".join(f"{name} {v['ratio']:.3f}" + ("" if v["ok"] else " CHECK FAILED")
                          for name, v in row["variants"].items())
        print(f"{tag} {m}x{n}x{k}: {baseline_key} {row['torch_ms']:.4f} ms | sized runs "
              f"{row['variants']['sized']['schedule']} | {shown} | best {best}", flush=True)
    return rows


def geomeans(rows, what):
    for key in [name for name, _ in variants()] + ["best"]:
        ratios = [r["variants"][r["best"] if key == "best" else key]["ratio"] for r in rows]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{what}: geometric mean, {key}: {geo:.3f} (lowest {min(ratios):.3f})")


def part_bare(out):
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    print("\nbare GEMM f16, sm_90a: x torch.matmul (higher is faster)")
    rows = []
    for shapes, tag in ((SWEEP_FEW, "sweep"), (OWN, "own"), (MANY, "many")):
        rows += run_rows(kernel, shapes, tag, "matmul")
    for tag in ("sweep", "own", "many"):
        geomeans([r for r in rows if r["tag"] == tag], tag)
    out["bare"] = rows


def part_fused(out):
    from kgen.parse import parse_file
    from kgen.tune.space import free_lines

    rows = []
    for example, shapes in (("gemm_bias_relu", [(1536, 1536, 6144), (1024, 1024, 1024),
                                                (768, 3072, 4096), (3000, 1000, 8000)]),
                            ("splitk_gelu", [(128, 4096, 4096), (128, 11008, 4096),
                                             (128, 4096, 11008), (64, 64, 65536),
                                             (4096, 4096, 4096)])):
        free = free_lines(parse_file(ROOT / "examples" / f"{example}.kg").kernels[0])
        print(f"\n{example}, f16, sm_90a: x PyTorch unfused (higher is faster)")
        rows += run_rows(free, shapes, example, "unfused")
        geomeans([r for r in rows if r["tag"] == example], example)
    out["fused"] = rows


def main() -> int:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--part", nargs="*", default=["bare", "fused"])
    opts = parser.parse_args()
    torch.manual_seed(0)
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               date=time.strftime("%Y-%m-%d"))
    print("device", out["device"], "torch", out["torch"])
    for part in opts.part:
        {"bare": part_bare, "fused": part_fused}[part](out)
        if opts.json:
            Path(opts.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
