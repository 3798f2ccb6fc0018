"""On an H100/H200: the epilogue tile (Staging): a 128x256 cooperative tile with 4
stages, whose whole-tile staging does not fit beside the ring, stages two 64x64 boxes per
consumer and stores them box by box. Against the reference with every output poisoned, at
ragged sizes (tiles past M and N, N not a multiple of 8 so the last column tile stores pairs,
K not a multiple of the k tile), for row- and column-major outputs, MN-major operands,
C's boxes staged in the epilogue tile's buffers (row- and column-major, under a cluster, on
ping-pong), staged vectors, ping-pong, a cluster, bf16 and batches."""
from __future__ import annotations

import pytest

from kgen import ir

from tests.gpu.test_batches_gpu import _check as check_batched
from tests.gpu.test_hopper_gpu import _run

pytestmark = pytest.mark.gpu

SIZES = [(1, 8, 8), (17, 24, 24), (1000, 1000, 1000), (4097, 4104, 72), (300, 520, 136),
         (129, 260, 4104), (64, 64, 64), (128, 1031, 200)]

# (label: kernel-level line, gemm lines, epilogue, dtype, A layout, B layout, D layout)
VARIANTS = {
    "bare": ("", "tile 128x256x64  warps 2x4  stages 4", "acc", "f16", "row", "col", "row"),
    "full": ("", "tile 128x256x64  warps 2x4  stages 4",
             "relu(alpha * acc + beta * C + bias[col])", "f16", "row", "col", "row"),
    "leaky": ("", "tile 128x256x64  warps 2x4  stages 4",
              "where(acc > 0, acc, 0.01 * acc) * scale[row] + bias[col]", "f16", "row", "col",
              "row"),
    "col_out": ("", "tile 128x256x64  warps 2x4  stages 4", "acc + bias[col]", "f16", "row",
                "col", "col"),
    "mn_major": ("", "tile 128x256x64  warps 2x4  stages 4", "gelu(acc)", "bf16", "col", "row",
                 "row"),
    "cluster": ("", "tile 128x256x64  warps 2x4  stages 4  cluster 2x1", "acc", "f16", "row",
                "col", "row"),
    "pingpong": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 6",
                 "relu(acc + bias[col])", "f16", "row", "col", "row"),
    # C's boxes loaded into the epilogue tile's buffers
    "col_c": ("", "tile 128x256x64  warps 2x4  stages 4", "acc + beta * C", "bf16", "row", "col",
              "col"),
    "cluster_c": ("", "tile 128x256x64  warps 2x4  stages 4  cluster 2x1",
                  "relu(alpha * acc + beta * C + bias[col])", "f16", "row", "col", "row"),
    "pingpong_c": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 6",
                   "C - 2.0 * acc", "f16", "row", "col", "row"),
}


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def kernel_of(label: str, batch: str = "") -> ir.Kernel:
    import dataclasses

    from kgen.parse import parse
    from kgen.verify import verify

    schedule, lines, expr, dt, a, b, d = VARIANTS[label]
    text = f"""
kernel tile_{label} {{
  target sm_90a
  {schedule}
  tensor A : {dt}[{batch}M, K] {a}
  tensor B : {dt}[{batch}K, N] {b}
  tensor C : {dt}[{batch}M, N] {d}
  tensor D : {dt}[{batch}M, N] {d} out
  vector bias : f32[N]
  vector scale : f32[M]
  scalar alpha : f32 = 1.5
  scalar beta : f32 = 0.5
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {expr} }}
  }}
}}
"""
    kernel = parse(text, f"tile_{label}.kg").kernels[0]
    used = {"A", "B", "D"} | {p for p in ("C", "bias", "scale", "alpha", "beta") if p in expr}
    kernel = dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name in used))
    verify(ir.Module((kernel,)))
    return kernel


def _stages_d(kernel) -> int:
    """The plan's epilogue tile; where the epilogue reads C, C's boxes are staged in it."""
    from kgen.lower import lower

    g = lower(kernel).schedule.gemms[0]
    assert g.staged.param == ("C" if any(p.name == "C" for p in kernel.params) else None)
    return g.staging.boxes


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("label", list(VARIANTS))
def test_the_epilogue_tile(label, mnk):
    kernel = kernel_of(label)
    assert _stages_d(kernel) == 2
    _run(kernel, mnk, "pingpong" if label.startswith("pingpong") else "cooperative")


@pytest.mark.parametrize("sizes", [dict(L=3, M=300, N=520, K=136), dict(L=2, M=129, N=264, K=72)],
                         ids=lambda s: "x".join(str(v) for v in s.values()))
def test_the_epilogue_tile_over_batches(sizes):
    kernel = kernel_of("full", batch="L, ")
    assert _stages_d(kernel) == 2
    check_batched(kernel, ir.Arch.SM90A, sizes)
