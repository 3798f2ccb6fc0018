"""On a GPU: back-to-back gemms (issue 5) against the reference at CUTLASS example 13's shapes
(M = 81920) and at ragged M, for every b2b example; the register example against a PyTorch
chain written out by hand; a chain of three gemms."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

EXAMPLES = sorted((Path(__file__).resolve().parent.parent.parent / "examples").glob("b2b*.kg"))


def _run(built, m):
    from kgen.harness.run import run

    report = run(built.kernel, built.plan, built.source, {"M": m}, check=True)
    assert report.checks, "no output was checked"
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)


@pytest.mark.parametrize("m", [81920, 1000, 130, 8])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_b2b_example_matches_reference(example, m):
    from kgen.api import build_file

    _run(build_file(example), m)


def test_b2b_rf_matches_a_pytorch_chain():
    torch = pytest.importorskip("torch")
    import kgen

    k = kgen.load(next(p for p in EXAMPLES if p.stem == "b2b_gemm_rf"))
    m = 1000
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = (torch.randn(m, 576, device="cuda", generator=gen) / 24).half()
    b0 = torch.randn(64, 576, device="cuda", generator=gen).half().t()  # column-major
    b1 = (torch.randn(128, 64, device="cuda", generator=gen) / 8).half().t()
    scale0 = torch.rand(64, device="cuda", generator=gen) + 0.5
    bias0 = torch.randn(64, device="cuda", generator=gen) * 0.1
    d1 = torch.full((m, 128), float("nan"), device="cuda", dtype=torch.half)
    k(A=a, B0=b0, B1=b1, D1=d1, scale0=scale0, bias0=bias0)
    torch.cuda.synchronize()
    inter = torch.relu((a.float() @ b0.float()) * scale0 + bias0).half()
    want = torch.relu(inter.float() @ b1.float())
    torch.testing.assert_close(d1.float(), want, atol=2e-3, rtol=4e-3)


CHAIN3 = """
kernel b2b3 {
  target sm_80
  tensor A : f16[M, 256] row
  tensor B0 : f16[256, 64] col
  tensor B1 : f16[64, 64] col
  tensor B2 : f16[64, 128] row
  tensor D2 : f32[M, 128] row out
  vector bias1 : f32[64]
  gemm g0 = A @ B0 {
    tile 64x64x32 warps 4x1 stages 3
    epilogue { g0 = relu(acc) }
  }
  gemm g1 = g0 @ B1 {
    tile 64x64x32 warps 2x2 stages 2
    keep g0 in smem
    epilogue { g1 = gelu(acc + bias1[col]) }
  }
  gemm g2 = g1 @ B2 {
    tile 64x128x32 warps 2x2 stages 2
    keep g1 in smem
    epilogue { D2 = acc }
  }
}
"""


@pytest.mark.parametrize("m", [4096, 77])
def test_chain_of_three_gemms(m):
    from kgen.api import build
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(CHAIN3, "b2b3.kg")
    verify(module)
    _run(build(module.kernels[0], source_name="b2b3.kg"), m)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("m", [81920, 1000])
def test_b2b_rf_with_b_streamed_matches_reference(m, persistent):
    """The register example without `keep B resident`: B streamed through the stages, on the
    plain grid (one CTA per tile) and on the persistent one that prefetches during g1."""
    import dataclasses

    from kgen.api import Built, read_module
    from kgen.emit import emit, emit_header
    from kgen.lower import lower

    module, _ = read_module(next(p for p in EXAMPLES if p.stem == "b2b_gemm_rf"))
    kernel = module.kernels[0]
    kernel = dataclasses.replace(kernel, gemms=tuple(
        dataclasses.replace(g, resident=False, resident_loc=None) for g in kernel.gemms))
    plan = lower(kernel, persistent=persistent)
    assert plan.schedule.scheduler.persistent == persistent and not plan.schedule.resident
    kw = dict(source_name="b2b_gemm_rf.kg", source_hash="", command="test")
    _run(Built(kernel, plan, emit(plan, **kw), emit_header(plan, **kw)), m)


@pytest.mark.parametrize("ctas", [1, 5])
def test_persistent_loop_over_many_tiles_along_m_and_n(ctas):
    """A few CTAs loop over 8 x 2 tiles (g1's tile N is half of N1: the CTAs along N recompute
    g0), each prefetching the next tile's g0 stages, against PyTorch."""
    torch = pytest.importorskip("torch")
    from kgen.api import build, load_built
    from tests.lower.test_chain import kernel

    built = build(kernel(G1TILE="128x64x32"), source_name="t.kg")
    assert built.plan.schedule.scheduler.persistent
    k = load_built(built)
    k.persistent_ctas = ctas
    m = 1000
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = (torch.randn(m, 576, device="cuda", generator=gen) / 24).half()
    b0 = torch.randn(64, 576, device="cuda", generator=gen).half().t()
    b1 = (torch.randn(128, 64, device="cuda", generator=gen) / 8).half().t()
    bias0 = torch.randn(64, device="cuda", generator=gen) * 0.1
    d1 = torch.full((m, 128), float("nan"), device="cuda", dtype=torch.half)
    bound = k.bind(A=a, B0=b0, B1=b1, D1=d1, bias0=bias0)
    assert bound.grid == (ctas, 1, 1)
    k.launch(bound, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    inter = torch.relu(a.float() @ b0.float() + bias0).half()
    want = torch.relu(inter.float() @ b1.float())
    torch.testing.assert_close(d1.float(), want, atol=2e-3, rtol=4e-3)


RESIDENT_OVERHANG = """\
kernel b2b_res160 {
  target sm_80
  tensor A : f16[M, 576] row
  tensor B0 : f16[576, 64] col
  tensor B1 : f16[64, 160] col
  tensor D1 : f16[M, 160] row out
  vector bias0 : f32[64]
  vector s1 : f32[160]
  gemm g0 = A @ B0 {
    tile 128x64x64 warps 8x1 stages 3
    keep B0 resident
    epilogue { g0 = relu(acc + bias0[col]) }
  }
  gemm g1 = g0 @ B1 {
    tile 128x256x32 warps 8x1 stages 2
    keep g0 in registers
    keep B1 resident
    epilogue { D1 = acc * s1[col] }
  }
}
"""


@pytest.mark.parametrize("m", [1000, 130])
def test_resident_chain_with_tiles_overhanging_n(m):
    """160 output columns in a tile of 256: the 16-byte stores skip the columns past N, and the
    epilogue's column-indexed vector is never read past its end."""
    from kgen.api import build
    from kgen.lower import lower
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(RESIDENT_OVERHANG, "b2b_res160.kg")
    verify(module)
    kernel = module.kernels[0]
    assert lower(kernel).schedule.wide_stores
    _run(build(kernel, source_name="b2b_res160.kg"), m)


# ---------------------------------------------------------------------------------------------
# Chains of three and four gemms on sm_90a's ping-pong wgmma chain (every gemm after the first
# with A from registers)

THREE = next(p for p in EXAMPLES if p.stem == "b2b3_gemm_rf_bf16_sm90a")


@pytest.mark.parametrize("m", [1, 17, 1000, 4097])
def test_chain_of_three_on_wgmma_at_ragged_m(m):
    """The three-gemm example at ragged M (one row; part of a 64-row tile; tiles of both
    consumer warpgroups), its output poisoned, against the float64 reference."""
    from kgen.api import build_file
    from tests.targets.test_sm90_long_chain import on_wgmma

    built = build_file(THREE)
    assert on_wgmma(built.plan)
    _run(built, m)


@pytest.mark.parametrize("m", [1000, 4097])
@pytest.mark.parametrize("dtype, widths, stages", [
    ("bf16", (64, 128, 128, 128), 6),  # four gemms
    ("f16", (128, 128, 256), 4),  # the last in two staged column passes
    ("bf16", (64, 64, 128), 6),  # three consumer warpgroups
])
def test_longer_chains_on_wgmma(dtype, widths, stages, m):
    from tests.targets.test_sm90_long_chain import built, long_chain_text, on_wgmma

    result = built(long_chain_text(dtype, 256, widths, stages=stages))
    assert on_wgmma(result.plan)
    _run(result, m)
