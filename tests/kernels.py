"""Kernels built directly as IR, shared by the lowering and emission tests."""
from __future__ import annotations

from pathlib import Path

from kgen import ir

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.kg"))


def _has_gemms(path: Path) -> bool:
    from kgen.parse import parse_file

    return any(k.gemms for k in parse_file(str(path)).kernels)


# The gemm and chain examples: the others are tile programs (a loop, or a row kernel), planned
# by kgen/lower/program.py with no gemm schedule, or storage-only declarations
GEMM_EXAMPLES = [p for p in EXAMPLES if _has_gemms(p)]

P, T, V, S = ir.Param, ir.ParamKind.TENSOR, ir.ParamKind.VECTOR, ir.ParamKind.SCALAR


# One f16 GEMM, D = A @ B with A row-major and B column-major: replace TARGET with the arch and
# LINES with its schedule lines ("" for none)
GEMM_TEXT = """\
kernel k {
  target TARGET
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  gemm g = A @ B {
    LINES
    epilogue { D = acc }
  }
}
"""


# A B2B chain written the obvious way, with no schedule line (issue 17's sweep): format with t
# (the operand dtype), k0, n0, n1
B2B_CHAIN = """\
kernel chain {{
  target sm_90a
  tensor A : {t}[M, {k0}] row
  tensor B0 : {t}[{k0}, {n0}] col
  tensor B1 : {t}[{n0}, {n1}] col
  tensor D1 : {t}[M, {n1}] row out
  vector scale0 : f32[{n0}]
  vector bias0 : f32[{n0}]
  gemm g0 = A @ B0 accumulate f32 {{
    epilogue {{ g0 = relu(acc * scale0[col] + bias0[col]) }}
  }}
  gemm g1 = g0 @ B1 accumulate f32 {{
    epilogue {{ D1 = relu(acc) }}
  }}
}}
"""


def b2b_chain_text(t: str, k0: int, n0: int, n1: int, *, target: str = "sm_90a",
                   schedule: str | None = None, g0: tuple[str, ...] = (),
                   g1: tuple[str, ...] = ()) -> str:
    """B2B_CHAIN's text for `target`, with a kernel `schedule` line and the schedule lines
    `g0` and `g1` (each line as written, e.g. "tile 64x64x64 warps 4x1 stages 4") at the top of
    each gemm."""
    text = B2B_CHAIN.format(t=t, k0=k0, n0=n0, n1=n1).replace(
        "  target sm_90a\n",
        f"  target {target}\n" + (f"  schedule {schedule}\n" if schedule else ""))
    for head, lines in (("gemm g0 = A @ B0 accumulate f32 {", g0),
                        ("gemm g1 = g0 @ B1 accumulate f32 {", g1)):
        text = text.replace(head, "\n    ".join((head, *lines)))
    return text


def chain_vectors_text(t: str, k0: int, n0: int, n1: int, vectors: str = "f32",
                       g0_epilogue: str | None = None) -> str:
    """B2B_CHAIN's text with scale0 and bias0 of dtype `vectors` and, where given, g0's
    epilogue `g0_epilogue`, which may also read the row vector `rowb : f32[M]`."""
    text = B2B_CHAIN.format(t=t, k0=k0, n0=n0, n1=n1).replace("f32[", f"{vectors}[")
    if g0_epilogue is not None:
        text = text.replace("g0 = relu(acc * scale0[col] + bias0[col])", g0_epilogue).replace(
            "  vector bias0", "  vector rowb : f32[M]\n  vector bias0")
    return text


def biased_chain_text(t: str, k0: int, n0: int, n1: int) -> str:
    """B2B_CHAIN's text whose last epilogue reads a column vector, bias1[col] (N1 elements:
    a column past N read there would be out of bounds)."""
    return B2B_CHAIN.format(t=t, k0=k0, n0=n0, n1=n1).replace(
        "  vector bias0", f"  vector bias1 : f32[{n1}]\n  vector bias0").replace(
        "D1 = relu(acc)", "D1 = relu(acc + bias1[col])")


def with_gemm_schedule(plan, index: int, **changes):
    """`plan` with the GemmSchedule of gemm `index` (negative from the last) changed: one
    Schedule value switched, as the emitter then reads it."""
    import dataclasses

    gemms = list(plan.schedule.gemms)
    gemms[index] = dataclasses.replace(gemms[index], **changes)
    return dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule,
                                                                  gemms=tuple(gemms)))


def assert_matches_reference(built, ms) -> None:
    """Run `built` (kgen.api.build's result) at each M of `ms` on the GPU, its outputs poisoned
    and checked against the float64 reference: every run checks an output and passes."""
    import json

    from kgen.harness.run import run

    for m in ms:
        report = run(built.kernel, built.plan, built.source, {"M": m}, check=True)
        assert report.checks, "no output was checked"
        assert report.ok, (m, json.dumps(report.as_dict()["checks"], indent=1))


def batched_chain(name: str, batched=("A", "D1", "D2", "C1"), drop_resident=False) -> ir.Kernel:
    """The b2b example `name` with a batch dimension `L` on the parameters in `batched` (those
    it has); `drop_resident` streams every B (a batched B cannot stay resident)."""
    import dataclasses

    from kgen.parse import parse_file

    kernel = parse_file(str(EXAMPLES[0].parent / f"{name}.kg")).kernels[0]
    params = tuple(dataclasses.replace(p, batch="L") if p.name in batched else p
                   for p in kernel.params)
    gemms = kernel.gemms
    if drop_resident:
        gemms = tuple(dataclasses.replace(g, resident=False, resident_loc=None) for g in gemms)
    return dataclasses.replace(kernel, params=params, gemms=gemms)


def run_host_probe(folder: Path, includes: list[str], body: list[str], arch: str) -> dict:
    """Build `int main() { body }` after `includes` with nvcc (the .cu files' host code only;
    their device code is compiled for `arch`, never run), run it, and return its printed
    `key|value` lines as a dict."""
    import shutil
    import subprocess

    main = folder / "probe.cu"
    main.write_text("\n".join(["#include <cstdio>", *includes, "int main() {", *body,
                               "  return 0;", "}", ""]))
    exe = folder / "probe"
    build = subprocess.run([shutil.which("nvcc"), "-std=c++17", f"-arch={arch}", str(main),
                            "-o", str(exe)], capture_output=True, text=True, cwd=folder)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return dict(line.split("|", 1) for line in run.stdout.splitlines())


def from_template(text: str, defaults: dict[str, str], **changes: str) -> ir.Kernel:
    """The one kernel of `text` after replacing each placeholder (the keys of `defaults`,
    overridden by `changes`) with its value: parsed as t.kg and verified."""
    from kgen.parse import parse
    from kgen.verify import verify

    for key, value in {**defaults, **changes}.items():
        text = text.replace(key, value)
    module = parse(text, "t.kg")
    verify(module)
    return module.kernels[0]


def gemm_kernel(
    epilogue: tuple[ir.Stmt, ...] | None = None,
    *,
    dtype: ir.DType = ir.DType.F16,
    a_layout: ir.Layout = ir.Layout.ROW,
    b_layout: ir.Layout = ir.Layout.COL,
    tile: tuple[int, int, int] = (128, 128, 64),
    warps: tuple[int, int] = (2, 2),
    stages: int = 3,
    arch: ir.Arch = ir.Arch.SM80,
    extra: tuple[ir.Param, ...] = (),
    name: str = "k",
) -> ir.Kernel:
    params = (
        P("A", T, dtype, ("M", "K"), a_layout),
        P("B", T, dtype, ("K", "N"), b_layout),
        P("D", T, dtype, ("M", "N"), role=ir.Role.OUT),
        *extra,
    )
    epi = epilogue if epilogue is not None else (ir.Store("D", ir.Acc()),)
    g = ir.Gemm(
        "mma0", ir.OperandRef("A"), ir.OperandRef("B"), ir.DType.F32, ir.TileShape(*tile),
        ir.WarpGrid(*warps), ir.StageCount(stages), ir.Epilogue(epi),
    )
    return ir.Kernel(name, arch, params, (g,))


# Tile configurations the tests sweep: (tile, warps, stages)
CONFIGS = [
    ((128, 256, 64), (2, 4), 3),
    ((128, 128, 64), (2, 2), 3),
    ((128, 128, 32), (2, 2), 4),
    ((256, 128, 64), (4, 2), 3),
    ((64, 64, 32), (2, 2), 2),
    ((64, 128, 32), (1, 2), 3),
]
LAYOUTS = [
    (ir.Layout.ROW, ir.Layout.COL),
    (ir.Layout.COL, ir.Layout.ROW),
    (ir.Layout.ROW, ir.Layout.ROW),
    (ir.Layout.COL, ir.Layout.COL),
]


_SCHEDULE_LINES = (
    r"\b(tile|warps)\s+[0-9]+(\s*x\s*[0-9]+)+",
    r"\b(stages|split)\s+[0-9]+",
    r"\bkeep\s+(\w+\s+in\s+)?(registers|smem)\b",
    r"\bkeep\s+\w+\s+resident\b",
    r"^\s*schedule\s+\w+",
)


def without_schedule_lines(text: str) -> str:
    """A .kg text with every schedule line (tile, warps, stages, keep, split, schedule) deleted;
    comments stay as they are."""
    import re

    out = []
    for line in text.splitlines(keepends=True):
        code, hash_, comment = line.partition("#")
        for pattern in _SCHEDULE_LINES:
            code = re.sub(pattern, "", code)
        if hash_ or code.strip() or not line.strip():
            out.append(code + hash_ + comment if hash_ else code.rstrip() + "\n")
    return "".join(out)


# Split-K with epilogue reductions (issue 16): format with name, arch, mode ("" or "reductions
# deterministic"), L ("L, " for a batch dimension, else ""), tile, warps, split, and the
# reductions' declarations and epilogue lines (split_reductions_text fills those)
_SPLIT_REDUCTIONS = """\
kernel {name} {{
  target {arch}
  {mode}
  tensor A : bf16[{L}M, K] row
  tensor B : bf16[K, N] col
  tensor G : bf16[{L}M, N] row out
{declarations}
  gemm mma0 = A @ B accumulate f32 {{
    tile {tile}  warps {warps}  stages 3  split {split}
    epilogue {{
      G = acc
{lines}
    }}
  }}
}}
"""
# every axis with a sum and a max: output name -> (length, reduction)
SPLIT_REDUCTIONS = {"rsum": ("M", "rowsum"), "rmax": ("M", "rowmax"), "csum": ("N", "colsum"),
                    "cmax": ("N", "colmax"), "asum": (None, "reduce_sum"),
                    "amax": (None, "reduce_max")}


def split_reductions_text(arch: str = "sm_80", deterministic: bool = False, split: int = 4,
                          reductions: dict | None = None, batched: bool = False,
                          tile: str = "64x128x64", warps: str = "2x2",
                          name: str = "splitk_red") -> str:
    """A split-K kernel G = A @ B (bf16, A row-major, B column-major) with epilogue reductions
    of acc (`reductions`: name -> (length or None for a scalar, reduction); every axis with a
    sum and a max by default), in the atomic or the deterministic mode, optionally batched."""
    L = "L, " if batched else ""
    reductions = reductions or SPLIT_REDUCTIONS
    declarations = []
    for out, (length, _) in reductions.items():
        if length is None:
            declarations.append(f"  scalar {out} : f32{'[L]' if batched else ''} out")
        else:
            declarations.append(f"  vector {out} : f32[{L}{length}] out")
    lines = [f"      {out} = {op}(acc)" for out, (_, op) in reductions.items()]
    return _SPLIT_REDUCTIONS.format(
        name=name, arch=arch, mode="reductions deterministic" if deterministic else "", L=L, tile=tile,
        warps=warps, split=split, declarations="\n".join(declarations), lines="\n".join(lines))


def split_reductions_kernel(**options) -> ir.Kernel:
    """split_reductions_text's kernel, parsed and verified."""
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(split_reductions_text(**options), "splitk_red.kg")
    verify(module)
    return module.kernels[0]
