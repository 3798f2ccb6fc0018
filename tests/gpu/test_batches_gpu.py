"""On a GPU: batched kernels against the float64 reference, on both targets.

Batches of 1, 3 and 17; a broadcast B and a broadcast A (batch stride 0, torch's expand); odd
sizes; a per-batch bias; per-batch reductions in the atomic and the deterministic mode; split-K
with batches; column-major operands; batch strides that are no 16-byte multiple (the narrow
entry point) and interleaved batches (a batch stride smaller than a matrix). Every output starts
as NaN, so an element no batch writes fails the check. sm_80 code runs on any GPU from sm_80 on;
the sm_90a cases need compute capability 9.0."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from kgen import ir

from tests.kernels import batched_chain

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
ARCHS = [ir.Arch.SM80, ir.Arch.SM90A]
BATCHES = [1, 3, 17]
# M x N x K: aligned, an odd N and K (the narrow entry point), tiny, several tiles with tails
SHAPES = [(128, 256, 64), (100, 129, 72), (7, 13, 9), (300, 520, 200)]


def _ids(shape):
    return "x".join(map(str, shape))


def _needs(arch):
    torch = pytest.importorskip("torch")
    if arch is ir.Arch.SM90A and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    return torch


def _example(name: str, arch: ir.Arch, **changes) -> ir.Kernel:
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / name).kernels[0]
    return dataclasses.replace(kernel, target=arch, **changes)


def _with_layouts(kernel: ir.Kernel, **layouts) -> ir.Kernel:
    params = tuple(dataclasses.replace(p, layout=layouts[p.name]) if p.name in layouts else p
                   for p in kernel.params)
    return dataclasses.replace(kernel, params=params)


def _torch_dtype(torch, dtype: ir.DType):
    return {ir.DType.F16: torch.float16, ir.DType.BF16: torch.bfloat16,
            ir.DType.F32: torch.float32}[dtype]


def _matrix(torch, shape, layout, dtype, scale=1.0):
    """A [.., rows, cols] tensor stored in `layout` (each matrix column-major for COL)."""
    if layout is ir.Layout.COL:
        return (torch.randn(*shape[:-2], shape[-1], shape[-2], device="cuda") * scale
                ).to(dtype).transpose(-1, -2)
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def _inputs(torch, kernel, sizes, broadcast=(), strided=None):
    """Random inputs in their declared layouts: a name in `broadcast` is one matrix expanded
    to every batch (batch stride 0); `strided` maps a name to a function that places it."""
    L = sizes["L"]
    scale_a = 1.0 / max(sizes["K"], 1) ** 0.5
    args = {}
    for p in kernel.params:
        if p.role is not ir.Role.IN or p.kind is ir.ParamKind.SCALAR:
            continue
        dims = tuple(sizes[d] if isinstance(d, str) else d for d in p.shape)
        dtype = _torch_dtype(torch, p.dtype)
        scale = scale_a if p.name == kernel.gemms[0].a.name else 1.0
        if p.kind is ir.ParamKind.VECTOR:
            full = dims if p.batch is None else (L, *dims)
            args[p.name] = (torch.rand(*full, device="cuda") * 0.75 + 0.25).to(dtype)
        elif p.batch is None:
            args[p.name] = _matrix(torch, dims, p.layout, dtype, scale)
        elif p.name in broadcast:
            args[p.name] = _matrix(torch, dims, p.layout, dtype, scale).expand(L, *dims)
        elif strided and p.name in strided:
            args[p.name] = strided[p.name](_matrix(torch, (L, *dims), p.layout, dtype, scale))
        else:
            args[p.name] = _matrix(torch, (L, *dims), p.layout, dtype, scale)
    return args


def _outputs(torch, kernel, sizes):
    """Every output, poisoned with NaN, in its declared layout."""
    out = {}
    for p in kernel.params:
        if p.role is not ir.Role.OUT:
            continue
        dims = tuple(sizes[d] if isinstance(d, str) else d for d in p.full_shape)
        dtype = _torch_dtype(torch, p.dtype)
        if p.kind is ir.ParamKind.TENSOR and p.layout is ir.Layout.COL:
            t = torch.empty(*dims[:-2], dims[-1], dims[-2], device="cuda", dtype=dtype)
            t = t.transpose(-1, -2)
        else:
            t = torch.empty(*dims, device="cuda", dtype=dtype)
        out[p.name] = t.fill_(float("nan"))
    return out


def _host(t, dtype: ir.DType):
    from kgen.reference import host_dtype

    return t.float().cpu().numpy().astype(host_dtype(dtype))


def _check(kernel, arch, sizes, *, broadcast=(), strided=None, scalars=None, expect_narrow=None,
           seed=0):
    """Run `kernel` once on random inputs and compare every output with the reference."""
    torch = _needs(arch)
    import kgen
    from kgen.reference import checking_dtype, compare, evaluate

    torch.manual_seed(seed)
    k = kgen.load(kernel, arch.value)
    args = _inputs(torch, kernel, sizes, broadcast, strided)
    outs = _outputs(torch, kernel, sizes)
    scalars = dict(scalars or {})
    bound = k.bind(**args, **outs, **scalars)
    if expect_narrow is not None:
        assert bool(bound.narrow) is expect_narrow, bound.narrow
    for name in broadcast if sizes["L"] > 1 else ():  # one batch: its stride means nothing
        # (DLPack may report a size-1 dimension's stride as the dense one)
        assert bound.values[f"batch_{name}"] == 0
    k(**args, **outs, **scalars)
    torch.cuda.synchronize()
    params = {p.name: p for p in kernel.params}
    host = {name: _host(t, params[name].dtype) for name, t in args.items()}
    ref = evaluate(kernel, host, scalars, batches=sizes["L"])
    for name, t in outs.items():
        got = _host(t, params[name].dtype)
        result = compare(got, ref[name], checking_dtype(kernel, name))
        assert result.ok, (name, result.summary())
    return k, bound


@pytest.mark.parametrize("mnk", SHAPES, ids=_ids)
@pytest.mark.parametrize("broadcast", [(), ("B",), ("A",)], ids=["own", "broadcast_B",
                                                                  "broadcast_A"])
@pytest.mark.parametrize("batches", BATCHES)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_batched_gemm_bias(arch, batches, broadcast, mnk):
    m, n, k = mnk
    sizes = {"L": batches, "M": m, "N": n, "K": k}
    fast = k % 8 == 0 and n % 8 == 0  # D leaves by TMA in 16-byte chunks on sm_90a
    _check(_example("batched_gemm_bias.kg", arch), arch, sizes, broadcast=broadcast,
           scalars={"alpha": 0.75}, expect_narrow=None if not fast else False)


@pytest.mark.parametrize("mnk", [(128, 256, 64), (100, 129, 72), (7, 13, 9)], ids=_ids)
@pytest.mark.parametrize("batches", BATCHES)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_column_major_operands(arch, batches, mnk):
    """A column-major, B row-major, D column-major (element accesses past the fast path)."""
    m, n, k = mnk
    kernel = _with_layouts(_example("batched_gemm_bias.kg", arch), A=ir.Layout.COL,
                           B=ir.Layout.ROW, D=ir.Layout.COL)
    _check(kernel, arch, {"L": batches, "M": m, "N": n, "K": k}, broadcast=("B",),
           scalars={"alpha": 1.25})


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mnk", [(130, 258, 72), (7, 13, 9), (300, 520, 200)], ids=_ids)
@pytest.mark.parametrize("batches", BATCHES)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_batched_reductions(arch, batches, mnk, deterministic):
    """Per-batch row maxima, column sums and largest magnitude (a scalar per batch), B shared by
    every batch."""
    m, n, k = mnk
    kernel = _example("batched_reductions.kg", arch, deterministic=deterministic)
    _check(kernel, arch, {"L": batches, "M": m, "N": n, "K": k})


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_deterministic_reductions_are_bit_identical(arch):
    torch = _needs(arch)
    import kgen

    kernel = _example("batched_reductions.kg", arch)
    k = kgen.load(kernel, arch.value)
    torch.manual_seed(7)
    L, M, N, K = 5, 1000, 600, 512
    a = torch.randn(L, M, K, device="cuda", dtype=torch.float16) / K ** 0.5
    b = torch.randn(N, K, device="cuda", dtype=torch.float16).t()
    results = []
    for _ in range(3):
        d, row_max, col_sum, peak = k(A=a, B=b)
        torch.cuda.synchronize()
        results.append((row_max.clone(), col_sum.clone(), peak.clone()))
    for other in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0], other))
    want = torch.einsum("lmk,kn->ln", a.double(), b.double())
    assert ((results[0][1].double() - want).abs() / (want.abs() + 1)).max().item() < 1e-3
    peak = (a.double() @ b.double()).abs().amax(dim=(1, 2))
    torch.testing.assert_close(results[0][2].double(), peak, atol=1e-3, rtol=1e-3)


def _splitk(arch, split, tile="tile 64x128x64  warps 2x2  stages 4"):
    from kgen.parse import parse

    source = f"""kernel splitk_batched {{
  target {arch.value}
  tensor A : f16[L, M, K] row
  tensor B : f16[L, K, N] col
  tensor D : f16[L, M, N] row out
  vector bias : f32[N]
  gemm g = A @ B accumulate f32 {{
    {tile}  split {split}
    epilogue {{ D = gelu(acc + bias[col]) }}
  }}
}}
"""
    return parse(source, "splitk_batched.kg").kernels[0]


@pytest.mark.parametrize("mnk", [(64, 64, 8192), (17, 129, 1000), (7, 13, 9)], ids=_ids)
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("batches", [1, 3, 17])
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_split_k_with_batches(arch, batches, split, mnk):
    m, n, k = mnk
    _check(_splitk(arch, split), arch, {"L": batches, "M": m, "N": n, "K": k},
           broadcast=("B",) if batches == 3 else ())


@pytest.mark.parametrize("mnk", [(64, 64, 8192), (17, 129, 1000), (7, 13, 9)], ids=_ids)
@pytest.mark.parametrize("split", [2, 5])
@pytest.mark.parametrize("batches", [1, 3, 17])
def test_split_k_with_batches_on_the_cooperative_kernel(batches, split, mnk):
    """A 128-row tile on sm_90a: the batches' units walked by the persistent CTAs."""
    from kgen.plan import KernelKind

    m, n, k = mnk
    kernel = _splitk(ir.Arch.SM90A, split, tile="tile 128x128x64  warps 2x4  stages 5")
    loaded, _ = _check(kernel, ir.Arch.SM90A, {"L": batches, "M": m, "N": n, "K": k},
                       broadcast=("B",) if batches == 3 else ())
    assert loaded.plan.schedule.scheduler.kind is KernelKind.COOPERATIVE
    assert loaded.plan.schedule.scheduler.split_k == split


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_batch_strides_off_the_16_byte_rule_run_narrow(arch):
    """A's batches 4 elements further apart than its matrices: every batch after the first
    starts 8 bytes off a 16-byte boundary, so the narrow entry point copies it (on sm_90a the
    copy engine cannot take it either)."""
    torch = _needs(arch)
    L, M, N, K = 3, 100, 256, 64

    def spaced(a):
        room = torch.empty(L * (M * K + 4), device="cuda", dtype=a.dtype)
        view = room.as_strided((L, M, K), (M * K + 4, K, 1))
        view.copy_(a)
        return view

    _, bound = _check(_example("batched_gemm_bias.kg", arch), arch,
                      {"L": L, "M": M, "N": N, "K": K}, strided={"A": spaced},
                      expect_narrow=True)
    assert "batch stride" in bound.narrow


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_interleaved_batches(arch):
    """A as a [M, L, K] tensor viewed as [L, M, K] (batch stride K, leading dimension L x K):
    batches closer than one matrix, still 16-byte aligned, so the fast entry point (rank-3 maps
    whose batch pitch is below their row pitch on sm_90a)."""
    L, M, N, K = 3, 200, 256, 64
    _check(_example("batched_gemm_bias.kg", arch), arch, {"L": L, "M": M, "N": N, "K": K},
           strided={"A": lambda a: a.permute(1, 0, 2).contiguous().permute(1, 0, 2)},
           expect_narrow=False)


def test_kgen_run_with_a_batch_size():
    """kgen run's harness: random batched inputs, poisoned outputs, the reference per batch."""
    pytest.importorskip("torch")
    from kgen.api import build_file
    from kgen.harness.run import run

    built = build_file(EXAMPLES / "batched_reductions.kg")
    report = run(built.kernel, built.plan, built.source,
                 {"L": 3, "M": 1030, "N": 260, "K": 72}, check=True)
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    assert [c.shape for c in report.checks] == [(3, 1030, 260), (3, 1030), (3, 260), (3,)]
    assert np.isclose(report.flops, 2 * 3 * 1030 * 260 * 72)


def test_a_large_batch_count():
    """More batches than a grid's y or z extent could hold: the batch is on the x axis."""
    torch = _needs(ir.Arch.SM80)
    import kgen

    k = kgen.load(_example("batched_gemm_bias.kg", ir.Arch.SM80), "sm_80")
    L, M, N, K = 70000, 8, 8, 16
    a = torch.randn(L, M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(N, K, device="cuda", dtype=torch.float16).t().expand(L, K, N)
    bias = torch.randn(L, N, device="cuda")
    d = k(A=a, B=b, bias=bias, alpha=1.0)
    torch.cuda.synchronize()
    want = a.double() @ b.double() + bias.double()[:, None, :]
    assert ((d.double() - want).abs() / (want.abs() + 1)).max().item() < 1e-2


@pytest.mark.parametrize("mnk", [(128, 256, 64), (100, 129, 72), (300, 520, 200)], ids=_ids)
@pytest.mark.parametrize("batches", BATCHES)
def test_pingpong_with_batches(batches, mnk):
    """`schedule pingpong`: each consumer warpgroup takes whole tiles of the batched walk."""
    m, n, k = mnk
    kernel = _example("batched_gemm_bias.kg", ir.Arch.SM90A, schedule=ir.Schedule.PINGPONG)
    g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(128, 128, 64),
                            warps=ir.WarpGrid(2, 4), stages=ir.StageCount(5))
    _check(dataclasses.replace(kernel, gemms=(g,)), ir.Arch.SM90A,
           {"L": batches, "M": m, "N": n, "K": k}, broadcast=("B",) if batches > 1 else ())


def test_torch_operator_allocates_batched_outputs():
    """kgen.torch_op: the batched outputs' shapes and strides from the inputs', per batch."""
    torch = _needs(ir.Arch.SM80)
    import kgen

    op = kgen.torch_op(kgen.load(_example("batched_reductions.kg", ir.Arch.SM80), "sm_80"))
    L, M, N, K = 3, 130, 258, 72
    a = torch.randn(L, M, K, device="cuda", dtype=torch.float16) / K ** 0.5
    b = torch.randn(N, K, device="cuda", dtype=torch.float16).t()
    d, row_max, col_sum, peak = op(a, b)
    torch.cuda.synchronize()
    assert d.shape == (L, M, N) and row_max.shape == (L, M) and col_sum.shape == (L, N)
    assert peak.shape == (L,)
    acc = a.double() @ b.double()
    torch.testing.assert_close(d.double(), acc, atol=2e-3, rtol=4e-3)
    torch.testing.assert_close(row_max.double(), acc.amax(dim=2), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(col_sum.double(), acc.sum(dim=1), atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(peak.double(), acc.abs().amax(dim=(1, 2)), atol=1e-3, rtol=1e-3)


# ---- chained gemms (back to back) -----------------------------------------------------------

CHAINS = sorted(p.stem for p in EXAMPLES.glob("b2b*.kg"))


def _run_chain(kernel, sizes):
    torch = pytest.importorskip("torch")
    if kernel.target is ir.Arch.SM90A and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    from kgen.api import build
    from kgen.harness.run import run

    built = build(kernel)
    report = run(built.kernel, built.plan, built.source, sizes, check=True)
    assert report.checks and report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    return built


@pytest.mark.parametrize("m", [1000, 130, 8])
@pytest.mark.parametrize("batches", BATCHES)
@pytest.mark.parametrize("name", CHAINS)
def test_batched_chains(name, batches, m):
    """Every b2b example with A and its output batched (B shared: resident chains keep it),
    persistent chains walking the tiles of every batch."""
    _run_chain(batched_chain(name), {"L": batches, "M": m})


@pytest.mark.parametrize("batches", [3, 17])
def test_batched_chain_with_batched_weights(batches):
    """B0, B1 and the vectors batched too (B streamed, not resident): each tile's batch of
    every operand, the next tile's first stages prefetched from its own batch."""
    kernel = batched_chain("b2b_gemm_rf", ("A", "B0", "B1", "D1", "scale0", "bias0"),
                            drop_resident=True)
    built = _run_chain(kernel, {"L": batches, "M": 1000})
    assert built.plan.schedule.scheduler.persistent and not built.plan.schedule.resident


@pytest.mark.parametrize("name", ["b2b_gemm_rf", "b2b_gemm_rf_sm90a",
                                  "b2b_gemm_rf_pingpong_sm90a"])
def test_batched_chain_with_a_broadcast_a(name):
    """A expanded to every batch (batch stride 0): every batch's D1 is the same chain."""
    kernel = batched_chain(name)
    torch = _needs(kernel.target)
    import kgen

    k = kgen.load(kernel)
    L, M = 5, 1000
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = (torch.randn(M, 576, device="cuda", generator=gen) / 24).half().expand(L, M, 576)
    b0 = torch.randn(64, 576, device="cuda", generator=gen).half().t()
    b1 = (torch.randn(128, 64, device="cuda", generator=gen) / 8).half().t()
    scale0 = torch.rand(64, device="cuda", generator=gen) + 0.5
    bias0 = torch.randn(64, device="cuda", generator=gen) * 0.1
    d1 = torch.full((L, M, 128), float("nan"), device="cuda", dtype=torch.half)
    k(A=a, B0=b0, B1=b1, D1=d1, scale0=scale0, bias0=bias0)
    torch.cuda.synchronize()
    inter = torch.relu((a[0].float() @ b0.float()) * scale0 + bias0).half()
    want = torch.relu(inter.float() @ b1.float())
    for b in range(L):
        torch.testing.assert_close(d1[b].float(), want, atol=2e-3, rtol=4e-3)
