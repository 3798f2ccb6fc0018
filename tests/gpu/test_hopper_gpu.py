"""On an H100/H200: the warp-specialized sm_90a GEMM (TMA ring, wgmma, cooperative and
ping-pong) against the float64 reference at ragged sizes, every epilogue op on it, its
register-store path (two outputs, one column-major), reductions in both modes, and the
deterministic mode bit-identical from run to run.

Sizes: M takes 1, 17, 1000 and 4097; N and K take their nearest multiples of 8 (8, 24, 1000,
4104), since the copy engine needs 16-byte row strides and the epilogue column pairs (the
shapes issue lifts both)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from kgen import ir

from tests.gpu.test_evt_gpu import ARGS, EXTRA, call
from tests.kernels import P, T, gemm_kernel

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SM90A = ir.Arch.SM90A
# (schedule, tile, warps, stages): the cooperative default, on 256-row tiles too (two m64
# halves per consumer), and on tiles whose N is not a multiple of 64 (the last staging box part
# full, copied out by the threads: in the epilogue tile at 256x160, in the whole tile's staging at
# 128x96), and the ping-pong requests, on 128-row tiles and on 64-row ones (one m64 row per
# consumer), with part boxes too
KINDS = {
    "cooperative": (None, (128, 256, 64), (2, 4), 3),
    "cooperative256": (None, (256, 128, 64), (2, 4), 4),
    "cooperative256x160": (None, (256, 160, 64), (2, 4), 3),
    # an odd number of n8 column groups (the last by stmatrix.x2), a ring of 4 beside one
    # staging box per consumer
    "cooperative256x152": (None, (256, 152, 64), (2, 4), 4),
    "cooperative128x96": (None, (128, 96, 64), (2, 4), 4),
    # the wave model's narrower 128-row widths: the last staging box 16 and 48 columns wide
    "cooperative128x144": (None, (128, 144, 64), (2, 4), 4),
    "cooperative128x176": (None, (128, 176, 64), (2, 4), 4),
    "pingpong": (ir.Schedule.PINGPONG, (128, 128, 64), (2, 4), 5),
    "pingpong64": (ir.Schedule.PINGPONG, (64, 256, 64), (2, 4), 4),
    # each consumer's own tile with its last staging box part full
    "pingpong128x96": (ir.Schedule.PINGPONG, (128, 96, 64), (2, 4), 5),
    "pingpong64x160": (ir.Schedule.PINGPONG, (64, 160, 64), (2, 4), 6),
}
SIZES = [(1, 8, 8), (17, 24, 24), (1000, 1000, 1000), (4097, 4104, 72), (17, 4104, 1000),
         (4097, 24, 4104), (1000, 8, 4104), (1, 1000, 24)]


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _kind(name: str) -> str:
    """The kernel kind a KINDS entry runs on."""
    return "pingpong" if name.startswith("pingpong") else "cooperative"


def _kernel(kind: str, stmts=None, *, dtype=ir.DType.F16, extra=(), name="k"):
    schedule, tile, warps, stages = KINDS[kind]
    k = gemm_kernel(stmts, dtype=dtype, tile=tile, warps=warps, stages=stages, arch=SM90A,
                    extra=extra, name=name)
    return dataclasses.replace(k, schedule=schedule)


def _run(kernel, mnk, kind=None):
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.plan import KernelKind, LoadPath, Mma

    built = build(kernel)
    s = built.plan.schedule
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert s.gemms[0].pipeline.a.load is LoadPath.TMA
    if kind is not None:
        assert s.scheduler.kind is KernelKind(kind)
    report = run(built.kernel, built.plan, built.source, dict(zip("MNK", mnk)), check=True)
    assert report.checks
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    return built


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [ir.DType.F16, ir.DType.BF16], ids=["f16", "bf16"])
def test_gemm_at_ragged_sizes(kind, mnk, dtype):
    _run(_kernel(kind, dtype=dtype), mnk, _kind(kind))


@pytest.mark.parametrize("mnk", [(1000, 1000, 40), (17, 4104, 136)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", list(ir.Op), ids=lambda o: o.name.lower())
def test_every_op(op, mnk):
    value = call(op, *ARGS[op.arity](op))
    value = call(ir.Op.ADD, value, call(ir.Op.MUL, ir.ScalarLoad("alpha"),
                                        ir.VectorLoad("rs", ir.Axis.ROW)))
    _run(_kernel("cooperative", (ir.Store("D", value),), extra=EXTRA,
                 name=f"op_{op.name.lower()}"), mnk)


@pytest.mark.parametrize("kind", list(KINDS))
def test_register_stores_of_two_outputs(kind):
    """Two outputs, one f32 column-major: the epilogue stores pairs from registers."""
    from kgen.plan import StorePath

    acc = ir.Acc()
    extra = (P("E", T, ir.DType.F32, ("M", "N"), ir.Layout.COL, ir.Role.OUT),)
    t = call(ir.Op.EXP, call(ir.Op.NEG, call(ir.Op.ABS, acc)))
    stmts = (ir.Let("t", t), ir.Store("D", call(ir.Op.MUL, ir.LocalRef("t"), ir.LocalRef("t"))),
             ir.Store("E", call(ir.Op.NEG, ir.LocalRef("t"))))
    built = _run(_kernel(kind, stmts, extra=extra), (1000, 1000, 72), _kind(kind))
    assert built.plan.schedule.gemms[0].output.path is StorePath.PAIRS


def _example(name, deterministic, kind=None):
    """The example on sm_90a; `kind`: its gemm on that KINDS entry's tile, warps and stages."""
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / name).kernels[0]
    if kind is not None:
        _, tile, warps, stages = KINDS[kind]
        g = kernel.gemms[0]
        g = dataclasses.replace(g, tile=ir.TileShape(*tile), warps=ir.WarpGrid(*warps),
                                stages=ir.StageCount(stages))
        kernel = dataclasses.replace(kernel, gemms=(g,))
    return dataclasses.replace(kernel, deterministic=deterministic, target=SM90A)


@pytest.mark.parametrize("kind", [None, "cooperative256", "cooperative256x160",
                                  "cooperative256x152"],
                         ids=["written", "256x128", "256x160", "256x152"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mnk", [(17, 24, 8), (1000, 1000, 40), (4097, 1030, 264)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["evt_softmax_stats.kg", "evt_colsum.kg"])
def test_reductions(name, mnk, deterministic, kind):
    _run(_example(name, deterministic, kind), mnk, "cooperative")


def test_deterministic_reductions_are_bit_identical():
    import torch

    import kgen

    k = kgen.load(_example("evt_colsum.kg", True), "sm_90a")
    torch.manual_seed(3)
    M, N, K = 3000, 1000, 512
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()  # K x N, column-major
    results = []
    for _ in range(3):
        outs = k(A=a, B=b)
        torch.cuda.synchronize()
        results.append([t.cpu().numpy().copy() for t in outs[1:]])
    for other in results[1:]:
        for x, y in zip(results[0], other):
            assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
