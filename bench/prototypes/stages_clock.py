"""A diagnostic, not a product path: does the sm_90a bare GEMM's mainloop wait on its ring?

The bare kernel (`D = acc`, f16) under Schedule values that differ in the ring's depth (and so
in how the output leaves: a 128x256 tile with 4 stages has no room for the whole-tile staging
and stores pairs from registers). For each: clock64() reads per tile in each consumer's first
thread (bench/prototypes/epilogue_clock.py's edit of the emitted text), then CUDA-event timings
beside torch.matmul (median of 30, inputs rotated past L2, in turn over `--rounds` rounds),
every kernel first checked against a float32 reference with its output poisoned.

    bash .gpu/device-run.sh python3 bench/prototypes/stages_clock.py [--sizes 4096,4096,4096 ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from epilogue_clock import instrument  # noqa: E402
from epilogue_cost import HEAD  # noqa: E402
from hopper_gemm import alloc, check, make_inputs  # noqa: E402

VARIANTS = {  # label: the gemm's schedule lines
    "128x256 s3": "tile 128x256x64  warps 2x4  stages 3",
    "128x256 s4": "tile 128x256x64  warps 2x4  stages 4",
    "128x256 s2": "tile 128x256x64  warps 2x4  stages 2",
    "128x192 s4": "tile 128x192x64  warps 2x4  stages 4",
    "128x192 s5": "tile 128x192x64  warps 2x4  stages 5",
}


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import Built
    from kgen.emit import emit, emit_header
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.lower import lower
    from kgen.parse import parse

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="*", default=["4096,4096,4096", "8192,8192,8192"])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--extra", nargs="*", default=[], help="label=schedule lines")
    opts = parser.parse_args()
    variants = {v: VARIANTS[v] for v in opts.variants}
    variants.update(dict(e.split("=", 1) for e in opts.extra))
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    stream = torch.cuda.current_stream().cuda_stream
    clock = torch.zeros(4, dtype=torch.int64, device="cuda")
    print("device", props.name)
    built = {}
    for label, lines in variants.items():
        text = HEAD.format(name="bare", expr="acc").replace(
            "tile 128x256x64  warps 2x4  stages 3", lines)
        kernel = parse(text, "bare.kg").kernels[0]
        kernel = dataclasses.replace(kernel, target=ir.Arch.SM90A, params=tuple(
            p for p in kernel.params if p.name in ("A", "B", "D")))
        plan = lower(kernel)
        g = plan.schedule.gemms[0]
        made = dict(source_name="bare.kg", source_hash="", command="stages_clock.py")
        source = emit(plan, **made)
        plain = kgen.api.load_built(Built(kernel, plan, source, emit_header(plan, **made)))
        clocked = kgen.api.load_built(Built(kernel, plan, instrument(source, clock.data_ptr()),
                                            emit_header(plan, **made)))
        built[label] = (kernel, plain, clocked)
        print(f"{label:12s} {plan.schedule.kind.name} stages {g.stages} store {g.store.name}")
    for text in opts.sizes:
        m, n, k = (int(x) for x in text.split(","))
        sizes = dict(M=m, N=n, K=k)
        set_bytes = 2 * (m * k + n * k + m * n)
        rotate = rotation_count(set_bytes, props.L2_cache_size)
        kernel0 = next(iter(built.values()))[0]
        sets = [make_inputs(torch, kernel0, sizes) for _ in range(max(2, rotate))]
        print(f"\nf16 {m}x{n}x{k}")
        runs = {}
        for label, (kernel, plain, clocked) in built.items():
            args = [{q: s[q] for q in ("A", "B")} for s in sets]
            err = check(torch, plain, kernel, args[0], lambda **a: a["A"].float() @ a["B"].float())
            outs = [{"D": alloc(torch, kernel.params[2], sizes)} for _ in sets]
            runs[label] = ([plain.bind(**a, **o) for a, o in zip(args, outs)], plain)
            bound = clocked.bind(**args[0], **outs[0])
            for _ in range(2):
                clocked.launch(bound, stream)
            torch.cuda.synchronize()
            clock.zero_()
            for _ in range(5):
                clocked.launch(bound, stream)
            torch.cuda.synchronize()
            main_c, epi_c, _, tiles = (int(x) for x in clock.tolist())
            k_tiles = (k + 63) // 64
            print(f"  {label:12s} err {err:.1e}  mainloop {main_c / tiles:9.0f} cycles per tile "
                  f"({main_c / tiles / k_tiles:6.1f} per k tile)  epilogue {epi_c / tiles:6.0f}")

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=rotate, stream=stream).median_ms

        times = {label: [] for label in ["matmul", *runs]}
        for _ in range(opts.rounds):
            times["matmul"].append(timed(lambda i: torch.matmul(sets[i % len(sets)]["A"],
                                                                sets[i % len(sets)]["B"])))
            for label, (bound, c) in runs.items():
                times[label].append(timed(lambda i: c.launch(bound[i % len(bound)], stream)))
        mm = min(times["matmul"])
        for label, ts in times.items():
            print(f"  {label:12s} {min(ts):.4f} ms ({', '.join(f'{t:.4f}' for t in ts)})  "
                  f"{mm / min(ts):.3f}x matmul  {2 * m * n * k / min(ts) / 1e9:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
