"""Diagnostic: the sm_90a narrow producer's K-major box loop (copy_box_granule) as emitted
against the same text with the loop unrolled further and, for a full unroll, the narrow entry
point's producer given 56 registers (its consumers 224), which NVRTC compiles without spills.
Same plan, same inputs, timed in alternation (CUDA events, the median, inputs rotated past L2)
beside torch.matmul, each checked against a float32 reference first. A text edit, for a
decision only: the .cu kgen writes is not changed by it. (Its first run compared the emitted
`unroll 1` with unroll 4 (bench/logs/narrow_mixed/narrow_unroll.log); its second, the emitted
unroll 4 with 8 and 16 (narrow_unroll_2.log). kgen now emits unroll 8.)

    bash .gpu/device-run.sh python3 bench/prototypes/narrow_unroll.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hopper_gemm import alloc, check, make_inputs  # noqa: E402

LOOP = ("#pragma unroll 8  // these passes' copies in flight at once, each with its own "
        "registers\n  for (int i = 0; i < kRows / 16; ++i)")
# (label, unroll, producer registers, consumer registers) of the narrow entry point
VARIANTS = [("unroll 8", 8, None, None), ("unroll 4", 4, None, None),
            ("unroll 16, 56/224 regs", 16, 56, 224)]
SHAPES = [(4096, 4096, 4092), (4096, 4096, 4094), (1000, 1000, 100), (3000, 5000, 1002)]
REFERENCES = {
    "gemm": lambda torch: (lambda A, B: A.float() @ B.float()),
    "gemm_b_row": lambda torch: (lambda A, B, bias: A.float() @ B.float() + bias),
}


def main() -> int:
    import torch

    from kgen import api
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.runtime.device import device_info
    from kgen.runtime.launch import CompiledKernel
    from kgen.runtime.nvrtc import compile_cubin, parse_ptxas_report

    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = torch.cuda.current_stream().cuda_stream
    info = device_info(0)
    for name in REFERENCES:
        built = api.build_file(ROOT / "examples" / f"{name}.kg", "sm_90a")
        plan, kernel = built.plan, built.kernel
        variants = {}
        for label, unroll, producer, consumer in VARIANTS:
            assert LOOP in built.source
            source = built.source.replace(LOOP, LOOP.replace("unroll 8", f"unroll {unroll}"))
            if producer:
                source = source.replace(
                    "setmaxnreg_dec<kProducerRegisters>();",
                    f"setmaxnreg_dec<kNarrow ? {producer} : kProducerRegisters>();").replace(
                    "setmaxnreg_inc<kConsumerRegisters>();",
                    f"setmaxnreg_inc<kNarrow ? {consumer} : kConsumerRegisters>();")
            result = compile_cubin(source, plan.name, info.arch)
            print(name, label, parse_ptxas_report(result.log, plan.narrow_kernel))
            variants[label] = CompiledKernel(plan, result.cubin, source=source)
        for m, n, k in SHAPES:
            sizes = dict(M=m, N=n, K=k)
            set_bytes = 2 * (m * k + n * k + 2 * m * n)
            rotate = rotation_count(set_bytes, l2)
            sets = [make_inputs(torch, kernel, sizes) for _ in range(max(2, min(rotate, 8)))]
            errs = {label: check(torch, c, kernel, sets[0], REFERENCES[name](torch))
                    for label, c in variants.items()}
            times = {label: [] for label in [*variants, "torch"]}
            for _ in range(3):
                times["torch"].append(time_kernel(
                    lambda i: torch.matmul(sets[i % len(sets)]["A"], sets[i % len(sets)]["B"]),
                    iters=20, warmup=3, rotate=rotate, stream=stream).median_ms)
                for label, c in variants.items():
                    outs = [{p.name: alloc(torch, p, sizes) for p in kernel.params
                             if p.role.value == "out"} for _ in sets]
                    bound = [c.bind(**s, **o) for s, o in zip(sets, outs)]
                    assert bound[0].narrow
                    times[label].append(time_kernel(
                        lambda i: c.launch(bound[i % len(bound)], stream), iters=20, warmup=3,
                        rotate=rotate, stream=stream).median_ms)
            med = {label: statistics.median(v) for label, v in times.items()}
            print(f"{name} {m}x{n}x{k}: " + ", ".join(
                f"{label} {ms:.4f} ms" + ("" if label == "torch" else
                                         f" (x torch {med['torch'] / ms:.3f}, err {errs[label]:.1e})")
                for label, ms in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
