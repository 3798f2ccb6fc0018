"""On an H100/H200: the sm_90a narrow entry point with one operand that meets the copy engine's
rules and one that does not. The aligned one still goes by TMA (whole boxes, both halves of a
cluster's shared operand, a batched map, a broadcast batch) while the producer warpgroup copies
the other by cp.async of 16, 8, 4 or 2 bytes; the full barrier then counts the copy engine's
arrival beside the warpgroup's. Against a float64 reference with the output poisoned."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (schedule lines, A layout, B layout): cooperative with the epilogue tile, a cluster sharing the
# K-major operand, ping-pong, split-K, stream-K
SCHEDULES = {
    "coop": ("tile 128x256x64  warps 2x4  stages 4", "row", "row"),
    "cluster_1x2": ("tile 128x128x64  warps 2x4  stages 4  cluster 1x2", "row", "row"),
    "pingpong": ("tile 128x128x64  warps 2x4  stages 5", "row", "row"),
    "split": ("tile 128x128x64  warps 2x4  stages 4  split 2", "row", "row"),
    "stream": ("tile 128x128x64  warps 2x4  stages 4  split stream", "row", "row"),
    "cluster_2x1_b_col": ("tile 128x128x64  warps 2x4  stages 4  cluster 2x1", "row", "col"),
}

# B row-major [K, N]: K % 8 != 0 leaves A's rows to the warpgroup (8-, 4- and 2-byte copies)
# and B's to the copy engine; N odd does the reverse (and the output leaves as pairs)
A_NARROW = [(1000, 1000, 100), (127, 8192, 33), (300, 264, 1002), (77, 4000, 31), (1, 8, 3),
            (4097, 136, 70), (256, 512, 4100)]
B_NARROW = [(1000, 1001, 104), (129, 257, 64), (64, 3, 8)]


def _kernel(label: str, batch: str = ""):
    from kgen.parse import parse
    from kgen.verify import verify

    lines, a, b = SCHEDULES[label]
    head = "schedule pingpong" if label == "pingpong" else ""
    text = f"""
kernel mixed_{label} {{
  target sm_90a
  {head}
  tensor A : f16[{batch}M, K] {a}
  tensor B : f16[{batch}K, N] {b}
  tensor D : f16[{batch}M, N] row out
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = alpha * acc + bias[col] }}
  }}
}}
"""
    module = parse(text, f"mixed_{label}.kg")
    verify(module)
    return module.kernels[0]


def _operand(torch, rows, cols, layout, offset=0, batches=None, scale=1.0):
    """A [rows, cols] f16 matrix in `layout` (values times `scale`), `offset` elements into a
    padded buffer (its base then 2 * offset bytes off 16, its rows still 16-byte multiples apart
    when `cols` is)."""
    lead = (batches,) if batches else ()
    stored = (cols, rows) if layout == "col" else (rows, cols)  # col: [cols, rows], transposed
    buf = (torch.randn(*lead, stored[0], stored[1] + 8, device="cuda") * scale).to(torch.float16)
    view = buf[..., offset:offset + stored[1]] if offset else buf[..., :stored[1]].contiguous()
    return view.transpose(-1, -2) if layout == "col" else view


def _check(kernel, a, b, expect_narrow=True):
    import torch

    import kgen

    k = kgen.load(kernel, "sm_90a")
    n = b.shape[-1]
    bias = torch.rand(n, device="cuda") + 0.25
    d = torch.full((*a.shape[:-1], n), float("nan"), device="cuda", dtype=torch.float16)
    bound = k.bind(A=a, B=b, D=d, bias=bias, alpha=1.5)
    assert bool(bound.narrow) is expect_narrow, bound.narrow
    k(A=a, B=b, D=d, bias=bias, alpha=1.5)
    torch.cuda.synchronize()
    want = 1.5 * (a.double() @ b.double()) + bias.double()
    got = d.double()
    assert not got.isnan().any(), "an output element was not written"
    err = ((got - want).abs() / (want.abs() + 1)).max().item()
    assert err < 0.02, err


def _needs_hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    return torch


@pytest.mark.parametrize("mnk", A_NARROW + B_NARROW, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("label", ["coop", "cluster_1x2", "pingpong", "split", "stream"])
def test_one_operand_by_the_copy_engine(label, mnk):
    torch = _needs_hopper()
    torch.manual_seed(sum(mnk))
    m, n, k = mnk
    a = _operand(torch, m, k, "row", scale=k ** -0.5)
    b = _operand(torch, k, n, "row")
    _check(_kernel(label), a, b)


@pytest.mark.parametrize("offsets", [(1, 0), (4, 0), (0, 2), (0, 1)],
                         ids=["A_2_bytes", "A_8_bytes", "B_4_bytes", "B_2_bytes"])
@pytest.mark.parametrize("mnk", [(1000, 1000, 1000), (300, 264, 136), (129, 4104, 72)],
                         ids=lambda s: "x".join(map(str, s)))
def test_an_unaligned_view_beside_an_aligned_operand(mnk, offsets):
    """A view some elements into a padded buffer (K a multiple of 8: the other operand meets
    the copy engine's rules), under a cluster that shares B: in the narrow entry point B's two
    halves go by TMA without multicast."""
    torch = _needs_hopper()
    torch.manual_seed(7)
    m, n, k = mnk
    a = _operand(torch, m, k, "row", offsets[0], scale=k ** -0.5)
    b = _operand(torch, k, n, "col", offsets[1])
    _check(_kernel("cluster_2x1_b_col"), a, b)


@pytest.mark.parametrize("broadcast", [False, True], ids=["own_B", "broadcast_B"])
def test_batches(broadcast):
    """A batched B by its rank-3 map (one batch expanded: batch stride 0), A by the warpgroup."""
    torch = _needs_hopper()
    torch.manual_seed(11)
    batches, m, n, k = 3, 300, 264, 100
    a = _operand(torch, m, k, "row", batches=batches, scale=k ** -0.5)
    b = (_operand(torch, k, n, "row").expand(batches, k, n) if broadcast
         else _operand(torch, k, n, "row", batches=batches))
    kernel = _kernel("coop", batch="L, ")
    _check(kernel, a, b)
