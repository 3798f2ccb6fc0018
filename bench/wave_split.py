"""The 128x192 tile and split-K on the cooperative kernel (issues 16 and 17), on an H100/H200:
each variant a Schedule value (a Config the builder fills in), against the default schedule and
torch.matmul, on the sweep shapes they were made for and on shapes of my own.

    bare GEMM  f16, every shape: the default (128x256 s4 with the epilogue tile), the runtime
               sizes' choice (`sized`: what kgen run and kgen.load take untuned), 128x256 s3
               (the whole tile's staging), 128x192 s4 and s3, and where the
               output has fewer 128x128 tiles than SMs, split-K on the cooperative kernel
               (128x128 s5, 128x64 s6) beside the tiled kernel's split-K
    gelu       D = gelu(acc + bias[col]) (examples/splitk_gelu.kg) at M = 1, 16, 128 against
               PyTorch unfused, the cooperative split-K beside the tiled one

Every variant is checked against the reference with its output poisoned (kgen.harness.run)
before it is timed: CUDA events, the median of 30, inputs rotated past L2.

    bash .gpu/device-run.sh python3 bench/wave_split.py [--json OUT.json] [--part bare gelu] [--quick]
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

from defaults import BARE, OWN, SWEEP, kgen_run, label  # noqa: E402

SMS = 132


def variants(m, n, k, quick=False):
    """(name, Config or None) for one shape: None is the builder's default. quick: the default,
    the sized choice, 128x256 on 3 stages (the whole tile's staging: the default before the
    epilogue tile) and 128x192 s4."""
    from kgen.targets import Config, GemmConfig

    out = [("default", None), ("sized", "sized"),
           ("128x256 s3", Config((GemmConfig((128, 256, 64), (2, 4), 3),))),
           ("128x192 s4", Config((GemmConfig((128, 192, 64), (2, 4), 4),)))]
    if quick:
        return out
    out += [
           ("128x192 s3", Config((GemmConfig((128, 192, 64), (2, 4), 3),))),
           ("128x192 s3", Config((GemmConfig((128, 192, 64), (2, 4), 3),))),
           ("128x128 s6", Config((GemmConfig((128, 128, 64), (2, 4), 6),))),
           ("128x64 s8", Config((GemmConfig((128, 64, 64), (2, 4), 8),)))]
    for tile, stages, warps, splits in (((128, 128, 64), 5, (2, 4), (2, 4, 8)),
                                        ((128, 64, 64), 6, (2, 4), (2, 4, 8, 16)),
                                        ((64, 128, 64), 4, (2, 2), (2, 4, 8))):
        tiles = -(-m // tile[0]) * -(-n // tile[1])
        if tiles >= SMS:
            continue
        kind = "tiled" if tile[0] == 64 else "coop"
        for split in splits:
            if k >= 2 * split * tile[2] and tiles * split <= 2 * SMS:
                out.append((f"{kind} {tile[0]}x{tile[1]} split {split}",
                            Config((GemmConfig(tile, warps, stages, split=split),))))
    return out


def part_bare(out, quick=False):
    from kgen import ir
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    print("\nbare GEMM, f16, sm_90a: each variant's time as x torch.matmul (higher is faster)")
    rows = []
    for shapes, own in ((SWEEP, False), (OWN, True)):
        for m, n, k in shapes:
            sizes = dict(M=m, N=n, K=k)
            row = dict(m=m, n=n, k=k, own=own, variants={})
            for name, config in variants(m, n, k, quick):
                report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A,
                                        torch_baseline=name == "default",
                                        config=None if config == "sized" else config,
                                        sized=config == "sized")
                if name == "default":
                    row["torch_ms"] = report.torch_timing.median_ms
                row["variants"][name] = dict(ms=report.timing.median_ms, ok=report.ok,
                                             schedule=label(plan))
            tms = row["torch_ms"]
            for v in row["variants"].values():
                v["x_matmul"] = tms / v["ms"]
            best = max(row["variants"], key=lambda v: row["variants"][v]["x_matmul"])
            row["best"] = best
            rows.append(row)
            shown = "  ".join(f"{name} {v['x_matmul']:.3f}" + ("" if v["ok"] else " CHECK FAILED")
                              for name, v in row["variants"].items())
            print(f"{'own ' if own else ''}{m}x{n}x{k}: matmul {tms:.4f} ms | {shown} | "
                  f"best {best}")
    for own in (False, True):
        picked = [r for r in rows if r["own"] is own]
        for key in ("default", "sized", "best"):
            ratios = [r["variants"][r["best"] if key == "best" else key]["x_matmul"]
                      for r in picked]
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"{'own shapes' if own else 'sweep'}: geometric mean x matmul, {key}: {geo:.3f}")
    out["bare"] = rows


def part_gelu(out):
    from kgen import ir
    from kgen.parse import parse_file
    from kgen.targets import Config, GemmConfig
    from kgen.tune.space import free_lines

    # the example's schedule lines freed: each variant fills them
    free = free_lines(parse_file(ROOT / "examples" / "splitk_gelu.kg").kernels[0])

    def split(tile, warps, stages, count):
        return Config((GemmConfig(tile, warps, stages, split=count),))

    searched = [("coop 128x128 split 2", split((128, 128, 64), (2, 4), 5, 2)),
                ("coop 128x128 split 4", split((128, 128, 64), (2, 4), 5, 4)),
                ("coop 128x64 split 2", split((128, 64, 64), (2, 4), 6, 2)),
                ("coop 128x64 split 4", split((128, 64, 64), (2, 4), 6, 4)),
                ("tiled 32x128 split 4", split((32, 128, 64), (1, 4), 4, 4)),
                ("tiled 64x128 split 2", split((64, 128, 64), (2, 2), 4, 2))]
    print("\ngelu(acc + bias[col]), f16, sm_90a: x PyTorch unfused (higher is faster); sized: "
          "what kgen run takes untuned, default: the size-blind builder's")
    rows = []
    shapes = [(m, n, k) for m in (1, 16, 128, 4096)
              for n, k in ((4096, 4096), (11008, 4096), (4096, 11008))] + [(64, 64, 65536)]
    for m, n, k in shapes:
        sizes = dict(M=m, N=n, K=k)
        row = dict(m=m, n=n, k=k, variants={})
        tried = [("sized", "sized"), ("default", None)] + (searched if m in (1, 16, 128) else [])
        for name, config in tried:
            report, plan = kgen_run(free, sizes, ir.Arch.SM90A,
                                    torch_baseline="torch_ms" not in row,
                                    config=None if config == "sized" else config,
                                    sized=config == "sized")
            if "torch_ms" not in row:
                row["torch_ms"] = report.torch_timing.median_ms
            row["variants"][name] = dict(ms=report.timing.median_ms, ok=report.ok,
                                         schedule=label(plan),
                                         x_unfused=row["torch_ms"] / report.timing.median_ms)
        rows.append(row)
        shown = "  ".join(f"{name} {v['x_unfused']:.2f}" + ("" if v["ok"] else " CHECK FAILED")
                          for name, v in row["variants"].items())
        print(f"{m}x{n}x{k}: unfused {row['torch_ms']:.4f} ms | sized runs "
              f"{row['variants']['sized']['schedule']} | {shown}")
    for key in ("sized", "default"):
        ratios = [r["variants"][key]["x_unfused"] for r in rows]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{key}: geometric mean x unfused {geo:.3f}, lowest {min(ratios):.2f}")
    out["gelu"] = rows


def main() -> int:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--part", nargs="*", default=["bare", "gelu"])
    parser.add_argument("--quick", action="store_true", help="the bare part's four variants")
    opts = parser.parse_args()
    torch.manual_seed(0)
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               date=time.strftime("%Y-%m-%d"))
    print("device", out["device"], "torch", out["torch"])
    for part in opts.part:
        if part == "bare":
            part_bare(out, opts.quick)
        else:
            part_gelu(out)
        if opts.json:
            Path(opts.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
