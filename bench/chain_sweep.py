"""Chains at any shape (issue 53): B2B chains `D1 = relu(relu(A @ B0 * scale0 + bias0) @ B1)`
written with no schedule line (kgen's choice) over a sweep of shapes on sm_90a, M = 81920.

For each chain: build it from its DSL text (tests/kernels.py's B2B_CHAIN), check it against a
float32 reference on random inputs (its output poisoned with NaN first; g0 rounded once to the
operand dtype, as the kernel keeps it), then time it, the PyTorch chain on the same inputs (in
the operand dtype throughout, cuBLAS and elementwise kernels) and a device copy of its bytes
(A, B0, B1 and the vectors read, D1 written), each with kgen/harness/timing.py's CUDA events
(median, the stream held while the runs are enqueued, input sets rotated past L2).

Printed: the table, the geometric mean of kgen's time over the copy's, the worst chain, and
the issue's rule: at least 2x the PyTorch chain wherever the PyTorch chain takes more than
1.5x the copy. A chain kgen refuses prints its located error in its row.

    bash .gpu/device-run.sh python3 bench/chain_sweep.py [--json OUT] [--iters 20]
        [--only dtype/K0/N0/N1,...] [--probe dtype/K0/N0/N1,...] [--pairs all|dtype/K0/N0/N1,...]
    python3 bench/chain_sweep.py --plans   (CPU: each chain's plan, registers and spills)

--probe times, at the chains given, every sm_90a configuration of the builder's list that
plans (kgen's choice marked *), checked the same way. --pairs times each chain's tiles paired
and not (Pipeline.paired: the two consumer warpgroups share B0's k tiles; the plan option
kgen.targets.sm90.chain_pairs.with_paired), on kgen's choice and, where its ring is odd, on the
deepest even ring of the builder's list.
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

from tests.kernels import B2B_CHAIN  # noqa: E402

M = 81920
# (dtype, K0, N0, N1): N0 from 32 to 256, N1 from 64 to 512, K0 from 64 to 1024, both dtypes;
# the odd sizes the issue names among them (N0 96, 160, 224; N1 192, 320, 384; K0 160, 320,
# 576, 1000: 160 and 1000 not multiples of the 64-element k tile). Each shape once, in one
# dtype, except the issue's own 320/96/192 in both. Chosen before any was measured.
SHAPES = (
    ("f16", 64, 32, 64), ("bf16", 64, 64, 128), ("f16", 128, 32, 256), ("bf16", 128, 128, 64),
    ("f16", 160, 80, 96), ("bf16", 192, 224, 448), ("f16", 256, 64, 192),
    ("bf16", 256, 96, 256), ("f16", 256, 128, 512), ("bf16", 256, 160, 320),
    ("f16", 256, 256, 256), ("bf16", 320, 96, 192), ("f16", 320, 96, 192),
    ("f16", 320, 64, 384), ("bf16", 384, 128, 128), ("f16", 384, 224, 192),
    ("bf16", 448, 32, 512), ("f16", 512, 96, 320), ("bf16", 512, 192, 128),
    ("f16", 576, 160, 384), ("bf16", 576, 224, 64), ("f16", 576, 160, 160),
    ("bf16", 640, 64, 256), ("f16", 704, 112, 320), ("bf16", 768, 128, 192),
    ("f16", 768, 256, 64), ("bf16", 832, 48, 128), ("f16", 1000, 64, 128),
    ("bf16", 1000, 96, 192), ("f16", 1000, 128, 320), ("bf16", 1000, 160, 64),
    ("f16", 1024, 32, 384), ("bf16", 1024, 64, 512), ("f16", 1024, 128, 256),
    ("bf16", 1024, 256, 128), ("f16", 64, 256, 512),
)
TORCH_FACTOR = 2.0  # the rule: at least 2x the PyTorch chain ...
SLOW_TORCH = 1.5  # ... wherever the PyTorch chain takes more than 1.5x the copy
COPY_TARGET = 1.25  # the geometric mean of kgen / copy


def chain_kernel(dtype: str, k0: int, n0: int, n1: int):
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


def label(plan) -> str:
    """A chain plan in a few words: kind, each gemm's tile and stages, and its components."""
    s = plan.schedule
    text = " | ".join(f"{'x'.join(map(str, g.tile))} s{g.stages}" for g in plan.gemms)
    extra = " B0 ring" if s.chain_ring_b else " resident" if s.resident else ""
    consumer = s.warps.role("consumer")
    extra += f" {consumer.groups} cons" if consumer is not None and consumer.groups != 2 else ""
    extra += "" if s.tma_output is not None else " reg-out"
    passes = s.gemms[-1].passes.count
    extra += f" {passes} passes" if passes > 1 else ""
    blocks = getattr(plan, "column_blocks", 1)
    extra += f" {blocks} blocks" if blocks > 1 else ""
    extra += " paired" if s.gemms[0].pipeline.paired else ""
    return f"{s.scheduler.kind.value} {text}{extra}"


def build_chain(spec, config=None):
    """(plan, source) of a chain (`config`: one of the builder's list; None: kgen's choice)."""
    from kgen import ir
    from kgen.api import build

    built = build(chain_kernel(*spec), ir.Arch.SM90A, source_name="chain.kg", config=config)
    return built.plan, built.source


def _compile(job):
    """One (source, kernel name, narrow entry) into the cubin cache (a worker of warm)."""
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    source, name, narrow = job
    result = compile_cubin(source, name, "sm_90a", extra_options=fast_entry_options(narrow))
    return result.registers, result.spill_stores + result.spill_loads


def warm(jobs) -> list:
    """Compile every job into the cubin cache, one process a core, before the timed runs."""
    import concurrent.futures
    import multiprocessing
    import os

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=context) as pool:
        return list(pool.map(_compile, jobs))


def copy_ms(nbytes: int, iters: int) -> float:
    """A device-to-device copy moving `nbytes` (half read, half written), rotated past L2."""
    import torch

    from kgen.harness.timing import rotation_count, time_kernel

    n = nbytes // 2
    sets = rotation_count(nbytes, torch.cuda.get_device_properties(0).L2_cache_size)
    pairs = [(torch.empty(n, dtype=torch.uint8, device="cuda"),
              torch.empty(n, dtype=torch.uint8, device="cuda")) for _ in range(sets)]
    stream = int(torch.cuda.current_stream().cuda_stream)
    return time_kernel(lambda i: pairs[i][1].copy_(pairs[i][0]), iters=iters, rotate=sets,
                       stream=stream).median_ms


def chain_inputs(dtype, k0: int, n0: int, n1: int):
    """Random inputs on the GPU, sums over K kept O(1); B0 and B1 K-major (`col`)."""
    import torch

    a = torch.randn(M, k0, device="cuda").div_(math.sqrt(k0)).to(dtype)
    b0 = torch.randn(n0, k0, device="cuda").to(dtype).t()
    b1 = torch.randn(n1, n0, device="cuda").div_(math.sqrt(n0)).to(dtype).t()
    signs = lambda: torch.randint(0, 2, (n0,), device="cuda").float().mul_(2).sub_(1)  # noqa
    scale0 = torch.empty(n0, device="cuda").uniform_(0.25, 1.0).mul_(signs())
    bias0 = torch.empty(n0, device="cuda").uniform_(0.25, 1.0).mul_(signs())
    return dict(A=a, B0=b0, B1=b1, scale0=scale0, bias0=bias0)


def reference(x):
    """The chain in float32, g0 rounded once to the operand dtype as the kernel keeps it."""
    import torch

    g0 = torch.relu(x["A"].float() @ x["B0"].float() * x["scale0"] + x["bias0"])
    return torch.relu(g0.to(x["A"].dtype).float() @ x["B1"].float())


def check(out, x, dtype_name: str) -> tuple[bool, str]:
    """Every element written and within kgen's tolerance of `reference`."""
    import torch

    from kgen import ir
    from kgen.reference import tolerance

    atol, rtol = tolerance(ir.DType.BF16 if dtype_name == "bf16" else ir.DType.F16)
    ref = reference(x)
    got = out.float()
    unwritten = int(torch.isnan(got).sum())
    bad = int((~((got - ref).abs() <= atol + rtol * ref.abs())).sum())
    worst = float((got - ref).abs().nan_to_num(float("inf")).max())
    return bad == 0, f"unwritten {unwritten}, bad {bad}, max |err| {worst:.3g}"


def measure(spec, plan, source, iters: int) -> dict:
    """Check and time one chain plan, with the PyTorch chain and the copy beside it."""
    import torch

    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.runtime.launch import CompiledKernel
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    dtype_name, k0, n0, n1 = spec
    dtype = torch.float16 if dtype_name == "f16" else torch.bfloat16
    result = compile_cubin(source, plan.name, "sm_90a",
                           extra_options=fast_entry_options(plan.narrow_kernel))
    kernel = CompiledKernel(plan, result.cubin, source=source, compiled=result,
                            narrow_compiled=False)
    nbytes = 2 * (M * k0 + k0 * n0 + n0 * n1 + M * n1) + 8 * n0
    sets = [chain_inputs(dtype, k0, n0, n1)
            for _ in range(rotation_count(nbytes, torch.cuda.get_device_properties(0)
                                          .L2_cache_size))]
    outs = [torch.full((M, n1), float("nan"), dtype=dtype, device="cuda") for _ in sets]
    stream = int(torch.cuda.current_stream().cuda_stream)
    bound = [kernel.bind(**x, D1=d) for x, d in zip(sets, outs)]
    kernel.launch(bound[0], stream)
    torch.cuda.synchronize()
    ok, note = check(outs[0], sets[0], dtype_name)
    ms = time_kernel(lambda i: kernel.launch(bound[i], stream), iters=iters, rotate=len(sets),
                     stream=stream).median_ms

    def torch_chain(i):
        x = sets[i]
        return torch.relu(torch.relu(x["A"] @ x["B0"] * x["scale0"].to(dtype)
                                     + x["bias0"].to(dtype)) @ x["B1"])

    torch_ms = time_kernel(torch_chain, iters=iters, rotate=len(sets), stream=stream).median_ms
    copy = copy_ms(nbytes, iters)
    del sets, outs, bound
    return dict(ok=ok, check=note, ms=ms, torch_ms=torch_ms, copy_ms=copy,
                copy_ratio=ms / copy, speedup=torch_ms / ms, torch_copy=torch_ms / copy,
                registers=result.registers, spills=result.spill_stores + result.spill_loads)


def spec_of(text: str) -> tuple[str, int, int, int]:
    dtype, k0, n0, n1 = text.split("/")
    return dtype, int(k0), int(n0), int(n1)


def name(spec) -> str:
    return f"{spec[0]:<5} {spec[1]:>5} {spec[2]:>4} {spec[3]:>4}"


def planned(specs) -> list:
    """(spec, plan, source) for each chain, or (spec, None, the located error)."""
    from kgen.errors import KgenError

    out = []
    for spec in specs:
        try:
            out.append((spec, *build_chain(spec)))
        except KgenError as err:
            out.append((spec, None, str(err)))
    return out


def sweep(specs, iters: int) -> list[dict]:
    chains = planned(specs)
    warm([(source, plan.name, plan.narrow_kernel) for _, plan, source in chains if plan])
    print(f"\nchains with no schedule line, sm_90a, M = {M}")
    print(f"{'dtype':<5} {'K0':>5} {'N0':>4} {'N1':>4} {'kgen choice':<56} {'ms':>7} "
          f"{'torch':>7} {'x torch':>7} {'copy':>7} {'/copy':>6} {'torch/copy':>10}")
    rows = []
    for spec, plan, source in chains:
        if plan is None:
            print(f"{name(spec)} REFUSED {source}")
            rows.append(dict(spec=spec, error=source))
            continue
        row = dict(spec=spec, schedule=label(plan), **measure(spec, plan, source, iters))
        rows.append(row)
        print(f"{name(spec)} {row['schedule']:<56} {row['ms']:7.4f} {row['torch_ms']:7.4f} "
              f"{row['speedup']:6.2f}x {row['copy_ms']:7.4f} {row['copy_ratio']:6.3f} "
              f"{row['torch_copy']:10.2f}" + (f" spill {row['spills']}" if row["spills"] else "")
              + ("" if row["ok"] else f"  CHECK FAILED ({row['check']})"), flush=True)
    summary(rows)
    return rows


def summary(rows: list[dict]) -> None:
    good = [r for r in rows if "ms" in r]
    if not good:
        return
    geo = math.exp(sum(math.log(r["copy_ratio"]) for r in good) / len(good))
    worst = max(good, key=lambda r: r["copy_ratio"])
    ruled = [r for r in good if r["torch_copy"] > SLOW_TORCH]
    missed = [r for r in ruled if r["speedup"] < TORCH_FACTOR]
    failed = [r for r in good if not r["ok"]]
    refused = len(rows) - len(good)
    print(f"\n{len(good)} chains ({refused} refused, {len(failed)} failed their check): "
          f"geomean {geo:.3f}x the copy (target <= {COPY_TARGET}), worst "
          f"{worst['copy_ratio']:.3f} ({name(worst['spec']).split()!r}); "
          f"{sum(r['copy_ratio'] <= COPY_TARGET for r in good)} within {COPY_TARGET}x")
    print(f"rule: {len(ruled)} chains where PyTorch takes over {SLOW_TORCH}x the copy, "
          f"{len(ruled) - len(missed)} of them at least {TORCH_FACTOR}x PyTorch"
          + ("" if not missed else "; missed: " + ", ".join(
              f"{'/'.join(map(str, r['spec']))} {r['speedup']:.2f}x" for r in missed))
          + f"; lowest x torch {min(r['speedup'] for r in good):.2f}")
    exempt = [r for r in good if r["torch_copy"] <= SLOW_TORCH]
    if exempt:  # the rule's "wherever": chains whose PyTorch chain is within 1.5x the copy
        print(f"not ruled (PyTorch within {SLOW_TORCH}x the copy): " + ", ".join(
            f"{'/'.join(map(str, r['spec']))} {r['torch_copy']:.2f}x" for r in exempt))


def probe(specs, iters: int) -> list[dict]:
    """Every sm_90a configuration of the builder's list that plans, at each chain."""
    from kgen import ir
    from kgen.errors import KgenError
    from kgen.lower import builder
    from kgen.targets import target

    jobs, chosen = [], set()
    for spec in specs:
        chosen.add(build_chain(spec)[1])
        seen = set()
        for config, _, _ in builder.listed(chain_kernel(*spec), target(ir.Arch.SM90A)):
            if config.schedule is None and config.gemms[0].tile[0] != 128:
                continue  # the sm_80 chains
            try:
                plan, source = build_chain(spec, config)
            except KgenError:
                continue
            if source in seen:
                continue
            seen.add(source)
            jobs.append((spec, plan, source))
    warm([(source, plan.name, plan.narrow_kernel) for _, plan, source in jobs])
    rows, last = [], None
    for spec, plan, source in jobs:
        if spec != last:
            print(f"\nprobe {'/'.join(map(str, spec))}")
            last = spec
        row = dict(spec=spec, schedule=label(plan), probe=True, chosen=source in chosen,
                   **measure(spec, plan, source, iters))
        rows.append(row)
        print(f"{'*' if row['chosen'] else ' '} {row['schedule']:<64} {row['ms']:7.4f} "
              f"{row['copy_ratio']:6.3f}x copy "
              f"{row['speedup']:5.2f}x torch" + (f" spill {row['spills']}" if row["spills"]
                                                  else "")
              + ("" if row["ok"] else f"  CHECK FAILED ({row['check']})"), flush=True)
    return rows


def pair_variants(spec) -> list:
    """(plan, source, chosen) of a chain's tiles paired and not (Pipeline.paired, the plan
    option with_paired): on kgen's choice, and on the deepest even ring of B0 streamed beside
    A in the builder's list where kgen's choice has an odd one (pairs need an even ring)."""
    from kgen import ir
    from kgen.emit import emit
    from kgen.errors import KgenError
    from kgen.lower import builder
    from kgen.targets import target
    from kgen.targets.sm90.chain_pairs import with_paired

    plan, source = build_chain(spec)
    bases = [(plan, source)]
    if plan.schedule.chain_ring_b and plan.gemms[0].stages % 2:
        for config, _, _ in builder.listed(chain_kernel(*spec), target(ir.Arch.SM90A)):
            if config.schedule is None or config.gemms[0].resident or config.gemms[0].stages % 2:
                continue
            try:
                even = build_chain(spec, config)
            except KgenError:
                continue
            if even[0].schedule.chain_ring_b and even[0].gemms[0].stages % 2 == 0:
                bases.append(even)
                break
    out = []
    for base, base_source in bases:
        for paired in (False, True):
            try:
                variant = with_paired(base, paired)
            except ValueError:
                continue
            text = emit(variant, source_name="chain.kg", source_hash="variant",
                        command="bench/chain_sweep.py --pairs")
            out.append((variant, text, base is plan
                        and paired == plan.schedule.gemms[0].pipeline.paired))
    return out


def pairs(specs, iters: int) -> list[dict]:
    """Each chain's tiles paired and not (pair_variants), checked and timed the same way."""
    jobs = [(spec, *v) for spec in specs for v in pair_variants(spec)]
    warm([(source, plan.name, plan.narrow_kernel) for _, plan, source, _ in jobs])
    rows = []
    for spec, plan, source, chosen in jobs:
        row = dict(spec=spec, schedule=label(plan), pairs=True, chosen=chosen,
                   **measure(spec, plan, source, iters))
        rows.append(row)
        print(f"{'*' if chosen else ' '} {name(spec)} {row['schedule']:<64} {row['ms']:7.4f} "
              f"{row['copy_ratio']:6.3f}x copy {row['speedup']:5.2f}x torch "
              f"{row['torch_copy']:5.2f} torch/copy"
              + (f" spill {row['spills']}" if row["spills"] else "")
              + ("" if row["ok"] else f"  CHECK FAILED ({row['check']})"), flush=True)
    return rows


def plans(specs) -> None:
    """CPU: each chain's plan, NVRTC's registers and spills."""
    chains = planned(specs)
    resources = iter(warm([(source, plan.name, plan.narrow_kernel)
                           for _, plan, source in chains if plan]))
    for spec, plan, source in chains:
        if plan is None:
            print(f"{name(spec)} REFUSED {source}")
            continue
        registers, spills = next(resources)
        print(f"{name(spec)} {label(plan):<60} regs {registers} spill {spills} B "
              f"smem {plan.smem_bytes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="dtype/K0/N0/N1,...: these chains instead of SHAPES")
    parser.add_argument("--probe", help="dtype/K0/N0/N1,...: every configuration at these")
    parser.add_argument("--pairs", help="dtype/K0/N0/N1,... or all: tiles paired and not")
    parser.add_argument("--no-sweep", action="store_true", help="--probe or --pairs alone")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--plans", action="store_true", help="CPU only: plans and registers")
    parser.add_argument("--json")
    args = parser.parse_args()
    specs = [spec_of(s) for s in args.only.split(",")] if args.only else list(SHAPES)
    if args.plans:
        plans(specs)
        return
    started = time.perf_counter()
    rows = [] if args.no_sweep else sweep(specs, args.iters)
    if args.probe:
        rows += probe([spec_of(s) for s in args.probe.split(",")], args.iters)
    if args.pairs:
        rows += pairs(list(SHAPES) if args.pairs == "all"
                      else [spec_of(s) for s in args.pairs.split(",")], args.iters)
    print(f"\n{time.perf_counter() - started:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
