"""Issue 16's "aligned shapes no slower than before": the fast entry point of today's .cu against
the .cu kgen wrote before the narrow entry point existed (bench/baseline/: the golden files of
commit 6200d71), same plan, same inputs, timed in alternation in one process (CUDA events, the
median, inputs rotated past L2), both first checked against a float32 reference.

    bash .gpu/device-run.sh python3 bench/before_after.py [--json OUT.json] [--rounds N]

`--narrow`: the narrow entry point instead, on sm_90a, at sizes whose K misses the copy engine's
16-byte rows (8-, 4- and 2-byte copies), against bench/baseline/narrow/ (the golden files of
the commit before the producer's copies were strength-reduced), with torch.matmul on the same
operands beside them.

`--baseline narrow_mixed --kernels gemm,gemm_bias_relu,gemm_b_row`: against the golden files of
the commit before the narrow producer's copies read whole rows per warp and an aligned operand
went by the copy engine (bench/baseline/narrow_mixed/). `--shapes 1000x1000x100,...` replaces
the sizes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hopper_gemm import alloc, check, make_inputs  # noqa: E402

CASES = [("gemm", "sm_80"), ("gemm_bias_relu", "sm_80"), ("gemm", "sm_90a"),
         ("gemm_bias_relu", "sm_90a")]
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
ROUNDS = 3
NARROW_CASES = [("gemm", "sm_90a"), ("gemm_bias_relu", "sm_90a")]
NARROW_SHAPES = [(4096, 4096, 4092), (4096, 4096, 4094), (4096, 4096, 4095), (1000, 1000, 100),
                 (2048, 8192, 1020)]


def _mapped(source: str) -> set[str]:
    """The parameters a .cu's TensorMaps struct holds a map of (none on sm_80)."""
    start = source.find("struct alignas(64) TensorMaps {")
    if start < 0:
        return set()
    body = source[start:source.index("};", start)]
    return set(re.findall(r"unsigned long long (\w+)\[16\];", body))


def main() -> int:
    import torch

    from kgen import api
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.runtime.device import device_info
    from kgen.runtime.launch import CompiledKernel
    from kgen.runtime.nvrtc import compile_cubin

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--narrow", action="store_true")
    parser.add_argument("--baseline", default=None, help="a folder of bench/baseline/")
    parser.add_argument("--kernels", default=None, help="examples, comma-separated")
    parser.add_argument("--shapes", default=None, help="MxNxK, comma-separated")
    opts = parser.parse_args()
    cases, shapes = (NARROW_CASES, NARROW_SHAPES) if opts.narrow else (CASES, SHAPES)
    if opts.kernels:
        cases = [(name, cases[0][1]) for name in opts.kernels.split(",")]
    if opts.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in opts.shapes.split(",")]
    baseline = ROOT / "bench/baseline" / (opts.baseline or ("narrow" if opts.narrow else ""))
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = torch.cuda.current_stream().cuda_stream
    info = device_info(0)
    references = {
        "gemm": lambda A, B: A.float() @ B.float(),
        "gemm_bias_relu": lambda A, B, C, bias: torch.relu(
            1.5 * (A.float() @ B.float()) + 0.5 * C.float() + bias),
        "gemm_b_row": lambda A, B, bias: A.float() @ B.float() + bias,
    }
    rows = []
    for name, arch in cases:
        built = api.build_file(ROOT / "examples" / f"{name}.kg", arch)
        new = api.load_built(built)
        source = (baseline / f"{name}.{arch}.cu").read_text()
        # the plan of that file: the same fields and maps (no narrow entry point before it)
        plan = built.plan if opts.narrow else dataclasses.replace(
            built.plan, schedule=dataclasses.replace(built.plan.schedule, narrow=False))
        # and its tensor maps: a later plan may map more (C, staged since: ReuseSmemC)
        mapped = _mapped(source)
        plan = dataclasses.replace(plan, schedule=dataclasses.replace(
            plan.schedule, tensor_maps=tuple(m for m in plan.schedule.tensor_maps
                                             if m.param in mapped)))
        old = CompiledKernel(plan, compile_cubin(source, plan.name, info.arch).cubin,
                             source=source)
        kernel = built.kernel
        for m, n, k in shapes:
            sizes = dict(M=m, N=n, K=k)
            set_bytes = 2 * (m * k + n * k + 2 * m * n)
            sets = [make_inputs(torch, kernel, sizes)
                    for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
            errs = {label: check(torch, c, kernel, sets[0], references[name])
                    for label, c in (("before", old), ("now", new))}
            times = {"before": [], "now": [], "torch": []}
            for _ in range(opts.rounds):
                if opts.narrow:  # the bare product on the same operands
                    times["torch"].append(time_kernel(
                        lambda i: torch.matmul(sets[i % len(sets)]["A"], sets[i % len(sets)]["B"]),
                        iters=20, warmup=3, rotate=rotation_count(set_bytes, l2),
                        stream=stream).median_ms)
                for label, c in (("before", old), ("now", new)):
                    outs = [{p.name: alloc(torch, p, sizes) for p in kernel.params
                             if p.role.value == "out"} for _ in sets]
                    bound = [c.bind(**s, **o) for s, o in zip(sets, outs)]
                    assert bool(bound[0].narrow) is opts.narrow
                    times[label].append(time_kernel(
                        lambda i: c.launch(bound[i % len(bound)], stream), iters=20, warmup=3,
                        rotate=rotation_count(set_bytes, l2), stream=stream).median_ms)
            before, now = statistics.median(times["before"]), statistics.median(times["now"])
            torch_ms = statistics.median(times["torch"]) if times["torch"] else None
            vs_torch = f", x torch.matmul {torch_ms / now:.3f}" if torch_ms else ""
            print(f"{name} {arch} {m}x{n}x{k}: before {before:.4f} ms, now {now:.4f} ms, "
                  f"now/before {now / before:.3f}{vs_torch} (errors {errs['before']:.1e} / "
                  f"{errs['now']:.1e}; rounds {times})")
            rows.append(dict(kernel=name, arch=arch, shape=[m, n, k], before_ms=before,
                             now_ms=now, torch_ms=torch_ms, ratio=now / before, rounds=times,
                             errors=errs))
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
