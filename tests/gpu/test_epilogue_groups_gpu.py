"""On an H100/H200: the epilogue in groups (EpilogueGroups, a Schedule value set
here on each plan the builder made), and a tile whose last columns end inside a 16-byte chunk
copied out of the staging by the consumer's threads.

Heavy EVTs (gelu, silu, tanh, exp) in a rolled loop over groups of columns, against the
reference with every output poisoned, at ragged sizes: the whole tile's staging (4 and 8
groups) and the epilogue tile's, C staged in either, ping-pong (two rows of fragments per
consumer), a column-major output, two outputs as pairs, a 192-column tile (3 groups) and row
reductions. Then rows (columns, column-major) padded so that the fast entry point's last tile
is copied out of the staging, grouped and unrolled: the values are right and the padding stays
NaN."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kgen import ir
from kgen.plan import EpilogueGroups

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SIZES = [(1, 8, 8), (17, 24, 24), (1000, 1000, 1000), (4097, 4104, 72), (129, 260, 4104)]

# (label: kernel-level line, gemm lines, epilogue, dtype, D layout, groups set on the plan)
VARIANTS = {
    "epilogue_tile": ("", "", "gelu(acc + bias[col])", "f16", "row", 4),
    "whole_tile": ("", "tile 128x256x64  warps 2x4  stages 3", "gelu(acc + bias[col])", "bf16",
                   "row", 4),
    "whole_tile_8": ("", "tile 128x256x64  warps 2x4  stages 3", "gelu_tanh(acc)", "f16", "row",
                     8),
    "c_epilogue_tile": ("", "", "C + 0.5 * gelu(acc)", "bf16", "row", 4),
    "c_whole_tile": ("", "tile 128x256x64  warps 2x4  stages 3", "C + 0.5 * gelu(acc)", "f16",
                     "row", 4),
    "pingpong": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 6",
                 "silu(acc) * scale[row]", "f16", "row", 2),
    "col_out": ("", "", "tanh(acc) + bias[col]", "f16", "col", 4),
    "col_c": ("", "tile 128x256x64  warps 2x4  stages 3", "C - gelu(acc)", "f16", "col", 4),
    "tile_192": ("", "tile 128x192x64  warps 2x4  stages 4", "exp(-abs(acc))", "f16", "row", 3),
}


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def kernel_of(label: str) -> ir.Kernel:
    from kgen.parse import parse
    from kgen.verify import verify

    schedule, lines, expr, dt, d, _ = VARIANTS[label]
    text = f"""
kernel grp_{label} {{
  target sm_90a
  {schedule}
  tensor A : {dt}[M, K] row
  tensor B : {dt}[K, N] col
  tensor C : {dt}[M, N] {d}
  tensor D : {dt}[M, N] {d} out
  vector bias : f32[N]
  vector scale : f32[M]
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {expr} }}
  }}
}}
"""
    kernel = parse(text, f"grp_{label}.kg").kernels[0]
    used = {"A", "B", "D"} | {p for p in ("C", "bias", "scale") if p in expr}
    kernel = dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name in used))
    verify(ir.Module((kernel,)))
    return kernel


def built_in(kernel: ir.Kernel, groups: int):
    """The builder's plan of `kernel` with its epilogue in `groups` groups, emitted."""
    from kgen.api import Built
    from kgen.emit import emit, emit_header
    from kgen.lower import lower

    plan = lower(kernel).with_gemm_schedule(
        groups=EpilogueGroups(groups, f"set by the test: {groups}"))
    made = dict(source_name=f"{kernel.name}.kg", source_hash="", command="test")
    return Built(kernel, plan, emit(plan, **made), emit_header(plan, **made))


def _check(built, mnk, kind: str) -> None:
    from kgen.harness.run import run

    assert built.plan.schedule.scheduler.kind.value == kind
    report = run(built.kernel, built.plan, built.source, dict(zip("MNK", mnk)), check=True)
    assert report.checks
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("label", list(VARIANTS))
def test_groups(label, mnk):
    built = built_in(kernel_of(label), VARIANTS[label][5])
    from kgen.plan import StorePath

    # the staging's walk and the narrow entry point's pairs, or one walk of pairs for both
    staging = built.plan.schedule.gemms[0].output.path is StorePath.TMA
    assert built.source.count("select_group(acc[i]") == (2 if staging else 1)
    _check(built, mnk, "pingpong" if label == "pingpong" else "cooperative")


@pytest.mark.parametrize("mnk", [(17, 24, 8), (1000, 1000, 40), (4097, 1030, 264)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["evt_softmax_stats.kg", "evt_multi_output.kg",
                                  "gemm_gelu_rowscale.kg"])
def test_examples(name, mnk):
    """Row reductions of exp, two outputs as pairs, gelu through the staging with a staged row
    vector (the last two in groups as the builder plans them)."""
    from kgen.lower import lower
    from kgen.parse import parse_file

    kernel = dataclasses.replace(parse_file(EXAMPLES / name).kernels[0], target=ir.Arch.SM90A)
    builder = lower(kernel).schedule.gemms[0].groups.count
    assert builder == (1 if name == "evt_softmax_stats.kg" else 4)  # exp alone stays unrolled
    _check(built_in(kernel, 4), mnk, "cooperative")


@pytest.mark.parametrize("groups", [1, 4], ids=["unrolled", "groups"])
@pytest.mark.parametrize("label", ["epilogue_tile", "whole_tile", "c_epilogue_tile",
                                   "c_whole_tile", "pingpong", "col_out", "col_c"])
def test_a_padded_last_tile_is_copied_out_of_the_staging(label, groups):
    """N = 258 with rows of 264 (M = 1001 with columns of 1008, column-major): the fast entry
    point, whose last tile ends inside a 16-byte chunk and is copied out of the staging."""
    import torch

    import kgen
    from kgen.reference import compare, evaluate, host_dtype

    kernel = kernel_of(label)
    built = built_in(kernel, min(groups, VARIANTS[label][5]))
    col = VARIANTS[label][4] == "col"
    tdt = torch.float16 if VARIANTS[label][3] == "f16" else torch.bfloat16
    k = kgen.api.load_built(built)
    M, N, K = (1001, 264, 200) if col else (1000, 258, 200)
    ld = 1008 if col else 264
    torch.manual_seed(11)

    def padded():
        whole = torch.randn(*((N, ld) if col else (M, ld)), device="cuda").to(tdt)
        return whole[:, :M].t() if col else whole[:, :N]

    args = {"A": (torch.randn(M, K, device="cuda") / K**0.5).to(tdt),
            "B": torch.randn(N, K, device="cuda").to(tdt).t(),
            "bias": torch.rand(N, device="cuda"), "scale": torch.rand(M, device="cuda"),
            "C": padded()}
    args = {name: t for name, t in args.items() if any(p.name == name for p in kernel.params)}
    d_whole = torch.full((N, ld) if col else (M, ld), float("nan"), device="cuda", dtype=tdt)
    d = d_whole[:, :M].t() if col else d_whole[:, :N]
    bound = k.bind(**args, D=d)
    assert not bound.narrow, bound.narrow
    k(**args, D=d)
    torch.cuda.synchronize()
    host = {name: t.float().cpu().numpy().astype(host_dtype(kernel.param(name).dtype))
            for name, t in args.items()}
    ref = evaluate(kernel, host)["D"]
    result = compare(d.float().cpu().numpy(), ref, kernel.param("D").dtype)
    assert result.ok, result.summary()
    assert torch.isnan(d_whole[:, M if col else N:]).all()  # the padding is never written
