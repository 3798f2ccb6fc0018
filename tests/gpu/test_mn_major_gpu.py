"""On an H100/H200: the sm_90a warp-specialized gemm with MN-major operands (a column-major A,
a row-major B) beside K-major ones, all four layout combinations, cooperative and ping-pong,
f16 and bf16, against the float32 PyTorch reference (TF32 off) with the outputs poisoned (NaN)
first: at ragged sizes (M, N in 1, 17, 1000, 4097; K in 8, 24, 1000, 4104), where the copy
engine loads whatever meets its 16-byte rules and the narrow entry point the rest, and with odd
leading dimensions and a base one element off, which take the narrow entry point (every
producer thread copying into the same swizzled stage layout)."""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from kgen import ir

from tests.kernels import gemm_kernel

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
ROW, COL = ir.Layout.ROW, ir.Layout.COL
LAYOUTS = {"a_row_b_col": (ROW, COL), "a_col_b_col": (COL, COL), "a_row_b_row": (ROW, ROW),
           "a_col_b_row": (COL, ROW)}
KINDS = {"cooperative": (None, (128, 256, 64), 3),
         "cooperative_256": (None, (256, 128, 64), 4),  # two m64 halves per consumer
         "pingpong": (ir.Schedule.PINGPONG, (128, 128, 64), 5),
         "pingpong64": (ir.Schedule.PINGPONG, (64, 128, 64), 8)}  # 64-row tiles
DTYPES = {"f16": ir.DType.F16, "bf16": ir.DType.BF16}
# every M and N of 1, 17, 1000, 4097 and every K of 8, 24, 1000, 4104, in mixed triples
SIZES = [(1, 1, 8), (17, 17, 24), (1000, 1000, 1000), (4097, 4097, 4104), (1, 4097, 1000),
         (4097, 1, 24), (17, 1000, 4104), (1000, 17, 8), (4097, 1000, 24), (1000, 4097, 8),
         (17, 4097, 1000), (4097, 17, 4104)]


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    torch.backends.cuda.matmul.allow_tf32 = False


def kernel(layouts: str, kind: str, dtype: str) -> ir.Kernel:
    """D = A @ B with A and B stored as `layouts` says, on the `kind` schedule."""
    schedule, tile, stages = KINDS[kind]
    a, b = LAYOUTS[layouts]
    k = gemm_kernel(dtype=DTYPES[dtype], a_layout=a, b_layout=b, tile=tile, warps=(2, 4),
                    stages=stages, arch=ir.Arch.SM90A)
    return dataclasses.replace(k, schedule=schedule)


@functools.lru_cache(maxsize=None)
def _loaded(layouts: str, kind: str, dtype: str):
    import kgen
    from kgen.plan import KernelKind, LoadPath

    k = kgen.load(kernel(layouts, kind, dtype), "sm_90a", tuned=False)
    s = k.plan.schedule
    assert s.scheduler.kind is KernelKind(kind.removesuffix("64").split("_")[0])
    assert s.gemms[0].pipeline.a.load is LoadPath.TMA
    assert (s.gemms[0].pipeline.a.mn_major, s.gemms[0].pipeline.b.mn_major) == (
        LAYOUTS[layouts][0] is COL, LAYOUTS[layouts][1] is ROW)
    return k


def operand(torch, rows: int, cols: int, layout: ir.Layout, dtype, pad: int = 0,
            offset: int = 0, scale: float = 1.0):
    """A rows x cols tensor stored row-major (ROW) or column-major (COL): its leading dimension
    `pad` elements longer than the contiguous extent, its first element `offset` elements into
    its buffer."""
    if layout is ROW:
        buf = torch.randn(rows, cols + pad + offset, device="cuda") * scale
        return buf.to(dtype)[:, offset:offset + cols]
    buf = torch.randn(cols, rows + pad + offset, device="cuda") * scale
    return buf.to(dtype)[:, offset:offset + rows].t()


def check(layouts, kind, dtype, mnk, pad=0, offset=0, narrow=None):
    import torch

    k = _loaded(layouts, kind, dtype)
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    m, n, kk = mnk
    a_layout, b_layout = LAYOUTS[layouts]
    a = operand(torch, m, kk, a_layout, tdtype, pad, offset, scale=kk ** -0.5)
    b = operand(torch, kk, n, b_layout, tdtype, pad, offset)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
    bound = k.bind(A=a, B=b, D=d)
    if narrow is not None:
        assert bool(bound.narrow) is narrow, bound.narrow
    k(A=a, B=b, D=d)
    torch.cuda.synchronize()
    want = a.float() @ b.float()
    assert not torch.isnan(d).any(), "an output element was never written"
    err = ((d.float() - want).abs() / (want.abs() + 1)).max().item()
    assert err < 0.02, (layouts, kind, dtype, mnk, err)


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("layouts", list(LAYOUTS))
def test_ragged_sizes(layouts, kind, dtype, mnk):
    check(layouts, kind, dtype, mnk)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("layouts", list(LAYOUTS))
def test_odd_leading_dimensions_take_the_narrow_entry_point(layouts, kind, dtype):
    """Rows an odd number of elements apart, a base 2 bytes off, odd sizes: the narrow entry
    point copies every operand element by element (or by 4 bytes) into the copy engine's
    layout; aligned contiguous operands keep the fast one."""
    check(layouts, kind, dtype, (1000, 1000, 1000), narrow=False)
    check(layouts, kind, dtype, (1000, 1000, 1000), pad=1, narrow=True)
    check(layouts, kind, dtype, (1000, 1000, 1000), pad=8, offset=1, narrow=True)
    check(layouts, kind, dtype, (999, 1001, 1003), narrow=True)
    check(layouts, kind, dtype, (17, 4097, 129), pad=3, narrow=True)


@pytest.mark.parametrize("mnk", [(1000, 1000, 1000), (17, 4097, 24), (4097, 17, 4104),
                                 (999, 1001, 1003)], ids=lambda s: "x".join(map(str, s)))
def test_the_b_row_example_with_its_bias(mnk):
    """examples/gemm_b_row.kg on sm_90a: B row-major (MN-major), D = A @ B + bias[col]."""
    import torch

    import kgen
    from kgen.parse import parse_file

    source = parse_file(EXAMPLES / "gemm_b_row.kg").kernels[0]
    k = kgen.load(dataclasses.replace(source, target=ir.Arch.SM90A), "sm_90a", tuned=False)
    assert k.plan.schedule.gemms[0].pipeline.b.mn_major
    m, n, kk = mnk
    a = torch.randn(m, kk, device="cuda").half() / kk ** 0.5
    b = torch.randn(kk, n, device="cuda").half()
    bias = torch.randn(n, device="cuda")
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    k(A=a, B=b, bias=bias, D=d)
    torch.cuda.synchronize()
    want = a.float() @ b.float() + bias
    assert not torch.isnan(d).any()
    assert ((d.float() - want).abs() / (want.abs() + 1)).max().item() < 0.02
