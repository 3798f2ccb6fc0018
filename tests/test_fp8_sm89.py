"""FP8 operands on sm_89: mma.sync m16n8k32 (e4m3, e5m2, mixed too) on the sm_80 mainloop
(kgen/targets/sm80/fp8.py). Verify's and the rulebook's located refusals (sm_80 and sm_86 have
no FP8 MMA; M/N-major operands; block scales; a k tile of one k32 step), the fragment maps
against PTX's m16n8k32 layout, the plan and its emission; NVRTC compiles for sm_89 without
spills, their PTX holding the FP8 mma.sync (slow)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.verify import verify

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = EXAMPLES / "gemm_fp8_sm89.kg"

TEXT = """\
kernel f {
  target TARGET
  tensor A : ADT[M, K] ALAYOUT
  tensor B : BDT[K, N] BLAYOUT
  tensor D : ODT[M, N] row out
  vector sa : f32[M]
  vector sb : f32[N]
  gemm g = A @ B accumulate f32 {
    LINES
    epilogue { D = acc * sa[row] * sb[col] }
  }
}
"""


def sm89_text(target="sm_89", a="f8e4m3", b="f8e4m3", a_layout="row", b_layout="col",
              out="bf16", lines=""):
    return (TEXT.replace("TARGET", target).replace("ADT", a).replace("BDT", b)
            .replace("ALAYOUT", a_layout).replace("BLAYOUT", b_layout).replace("ODT", out)
            .replace("LINES", lines))


def refusal(text: str) -> KgenError:
    with pytest.raises(KgenError) as info:
        verify(parse(text, "f.kg"))
    return info.value


def built(text: str):
    from kgen.api import build

    return build(parse(text, "f.kg").kernels[0], source_name="f.kg")


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# -- verify and the rulebook ------------------------------------------------------------------


def test_the_example_verifies_and_targets_sm_89():
    module = parse(EXAMPLE.read_text(), EXAMPLE.name)
    verify(module)
    assert module.kernels[0].target is ir.Arch.SM89


@pytest.mark.parametrize("target", ["sm_80", "sm_86"])
def test_targets_without_fp8_mma_refuse_it_at_the_gemm(target):
    text = sm89_text(target=target)
    err = refusal(text)
    assert (f"FP8 operands need FP8 tensor cores, target sm_89 (mma.sync m16n8k32) or sm_90a; "
            f"{target}'s mma.sync takes 16-bit operands only") == err.message
    assert err.loc.line == line_of(text, "gemm g")


@pytest.mark.parametrize("which, layouts, line, wanted", [
    ("A", dict(a_layout="col"), "tensor A", "row"),
    ("B", dict(b_layout="row"), "tensor B", "col"),
])
def test_an_mn_major_operand_is_refused_saying_ldmatrix_cannot_transpose_bytes(
        which, layouts, line, wanted):
    text = sm89_text(**layouts)
    err = refusal(text)
    assert f"FP8 operand {which} '{which}' at line {line_of(text, line)}" in err.message
    assert "ldmatrix, which cannot transpose 8-bit elements" in err.message
    assert f"declare it {wanted}" in err.message
    assert err.loc.line == line_of(text, "gemm g")


def test_block_scales_are_refused_on_sm_89_at_their_line():
    text = (EXAMPLES / "gemm_fp8_blockwise.kg").read_text().replace("target sm_90a",
                                                                     "target sm_89")
    err = refusal(text)
    assert "block scales run on sm_90a only" in err.message
    assert "on sm_89 scale tensor-wise (scalars) or per row and column (vectors)" in err.message
    assert err.loc.line == line_of(text, "scale A by SA")


def test_block_scales_lowered_for_sm_89_are_refused_by_the_rulebook():
    """Verified for sm_90a, lowered for sm_89 (`--arch sm_89`): every sm_89 schedule refuses
    the scales (its mainloop has no promotion step), located at the gemm."""
    from kgen.api import build_file

    with pytest.raises(KgenError) as info:
        build_file(EXAMPLES / "gemm_fp8_blockwise.kg", "sm_89")
    assert "block scales run on sm_90a only" in info.value.message
    text = (EXAMPLES / "gemm_fp8_blockwise.kg").read_text()
    assert info.value.loc.line == line_of(text, "gemm ")


def test_the_sm_89_example_lowered_for_sm_86_is_refused():
    from kgen.api import build_file

    with pytest.raises(KgenError) as info:
        build_file(EXAMPLE, "sm_86")
    assert "sm_86's mma.sync takes 16-bit operands only" in info.value.message
    assert "lowered for sm_86" in info.value.message
    assert info.value.loc.line == line_of(EXAMPLE.read_text(), "gemm mma0")


def test_a_k_tile_of_one_k32_step_is_refused_at_the_tile_line():
    text = sm89_text(lines="tile 64x64x32  warps 2x2  stages 3")
    with pytest.raises(KgenError) as info:
        built(text)
    assert info.value.message == ("tile K must be a multiple of 64 (two k32 steps of the FP8 "
                                  "MMA), got 32")
    assert info.value.loc.line == line_of(text, "tile 64x64x32")
    built(sm89_text(lines="tile 64x64x64  warps 2x2  stages 3"))  # two k32 steps plan


# -- the fragments: PTX's m16n8k32 layout, read by the proved ldmatrix maps ----------------------


def _ldmatrix_bytes(which: str, lane_rows, lane: int) -> list[list[tuple[int, int]]]:
    """The (row, byte column) of each of the 4 bytes of each register ldmatrix.x4 hands `lane`,
    where lane_rows[l] is the (row, byte column) whose 16 bytes lane l addresses: register j
    holds matrix j's row lane / 4, bytes (lane % 4) * 4 .. + 3 (b16 pairs, two per word)."""
    out = []
    for j in range(4):
        row, col = lane_rows[8 * j + lane // 4]
        out.append([(row, col + (lane % 4) * 4 + e) for e in range(4)])
    return out


@pytest.mark.parametrize("kk", [0, 1, 3])
def test_the_8_bit_maps_hand_each_lane_ptx_m16n8k32_fragments(kk):
    """A (16 x 32 bytes of M x K) and B (two n8 tiles of 8 x 32 bytes of N x K), both K-major:
    PTX's m16n8k32 .e4m3/.e5m2 layout gives lane (g = lane / 4, t = lane % 4)
    a0..a3 (row g, k 4t..4t+3), a4..a7 (row g + 8), a8..a11 (row g, k 16 + 4t..),
    a12..a15 (row g + 8, k 16 + 4t..); b0..b3 (k 4t..4t+3, col g), b4..b7 (k 16 + 4t.., col g).
    The maps the lowering proves its offsets with must load exactly those bytes."""
    from kgen.lower.fragments import ldmatrix_map

    k0 = kk * 32
    a_map, b_map = ldmatrix_map("a", True, 1), ldmatrix_map("b", True, 1)
    a_rows = [a_map.coord(lane, 0, 0, kk) for lane in range(32)]
    b_rows = [b_map.coord(lane, 0, 0, kk) for lane in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a = _ldmatrix_bytes("a", a_rows, lane)
        want_a = [[(g + 8 * (r % 2), k0 + 16 * (r // 2) + 4 * t + e) for e in range(4)]
                  for r in range(4)]
        assert a == want_a, lane
        b = _ldmatrix_bytes("b", b_rows, lane)  # registers (n8 tile 0: b0, b1; tile 1: b0, b1)
        for n8 in range(2):
            want_b = [[(8 * n8 + g, k0 + 16 * half + 4 * t + e) for e in range(4)]
                      for half in range(2)]
            assert b[2 * n8: 2 * n8 + 2] == want_b, (lane, n8)


def test_the_8_bit_maps_in_cpp_match_the_python_ones():
    from kgen.lower.fragments import ldmatrix_map
    from kgen.targets.common.operands import LDMATRIX_ROW_COL_8BIT

    for (which, k_major), (row, col) in LDMATRIX_ROW_COL_8BIT.items():
        fmap = ldmatrix_map(which, k_major, 1)
        code = [compile(e.replace("/", "//"), "<cpp>", "eval") for e in (row, col)]
        for lane in range(32):
            for warp_off in (0, 32):
                for f in range(3):
                    for kk in range(4):
                        env = dict(lane=lane, warp_off=warp_off, f=f, kk=kk)
                        got = tuple(eval(c, {}, env) for c in code)
                        assert got == fmap.coord(lane, warp_off, f, kk), (which, env)


def test_the_fragment_loads_are_bank_conflict_free():
    """Every phase of 8 lanes of each ldmatrix reads 8 distinct 16-byte bank groups of the
    swizzled 8-bit tiles the builder plans."""
    from kgen.lower.fragments import ldmatrix_map
    from kgen.lower.swizzle import max_bank_conflict

    plan = built(sm89_text()).plan
    g = plan.gemms[0]
    for op, which in ((g.a, "a"), (g.b, "b")):
        fmap = ldmatrix_map(which, True, 1)
        for kk in range(g.tile[2] // 32):
            for f in range(2):
                addrs = [op.smem.offset(*fmap.coord(lane, 0, f, kk)) for lane in range(32)]
                assert max_bank_conflict(addrs, 16) == 1, (which, kk, f)


# -- the plan and its emission -----------------------------------------------------------------


def test_the_builder_plans_the_fp8_mma_sync_and_inspect_says_why():
    from kgen.plan import KernelKind, Mma
    from kgen.report import instruction

    plan = built(sm89_text()).plan
    g, s = plan.gemms[0], plan.schedule
    assert s.scheduler.kind is KernelKind.TILED
    assert s.gemms[0].atom.instruction is Mma.MMA_SYNC_FP8
    assert "k32 steps over the same 32 bytes" in s.gemms[0].atom.why
    assert g.mma == (16, 8, 32) and g.tile == (128, 256, 64) and g.stages == 4
    assert instruction(plan, g) == "mma.sync m16n8k32, f8e4m3 x f8e4m3"
    assert len(g.a.frag_steps) == 2  # two k32 steps per 64-byte k tile
    assert plan.storage.total_bytes <= plan.storage.limit_bytes == 99 * 1024
    rows = {label: why for label, _, why in s.describe()}
    assert "sm_89's mma.sync m16n8k32 on FP8 operands" in rows["line g tile"]


def test_every_listed_configuration_has_whole_k32_pairs_and_fits_sm_89():
    from kgen.lower.builder import shapes as gemm_shapes
    from kgen.targets import configs, target

    kernel = parse(sm89_text(), "f.kg").kernels[0]
    for wide in (False, True):
        listed = configs(target(ir.Arch.SM89), gemm_shapes(kernel), sizes={}, wide=wide)
        assert listed
        for c in listed:
            (m, n, k), stages = c.gemms[0].tile, c.gemms[0].stages
            assert k % 64 == 0 and (m + n) * k * stages <= 99 * 1024, c.label


@pytest.mark.parametrize("a, b", [("f8e4m3", "f8e4m3"), ("f8e4m3", "f8e5m2"),
                                  ("f8e5m2", "f8e4m3"), ("f8e5m2", "f8e5m2")])
def test_the_emission_holds_the_fp8_mma_sync(a, b):
    names = {"f8e4m3": "e4m3", "f8e5m2": "e5m2"}
    source = built(sm89_text(a=a, b=b)).source
    assert f"mma.sync.aligned.m16n8k32.row.col.f32.{names[a]}.{names[b]}.f32" in source
    assert "mma_16816" not in source and "#include <cuda_fp8.h>" in source
    assert "__CUDA_ARCH__ < 890" in source and "major * 10 + minor < 89" in source
    assert "copy_granule_8bit(p.A, p.ld_A)" in source


def test_16_bit_sm_89_kernels_keep_the_k16_mma():
    source = built(sm89_text(a="bf16", b="bf16", b_layout="row")).source
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in source
    assert "m16n8k32" not in source and "cuda_fp8.h" not in source


def test_an_fp8_output_with_its_scale_emits_saturating_stores():
    text = sm89_text(out="f8e4m3").replace("acc * sa[row] * sb[col]",
                                           "acc * sa[row] * sb[col] * so").replace(
        "  vector sa", "  scalar so : f32 = 1.0\n  vector sa")
    source = built(text).source
    assert "__nv_fp8x2_e4m3(make_float2(" in source


def test_the_reference_is_the_dequantized_product_scaled():
    from kgen.api import build_file
    from kgen.harness.inputs import make_inputs
    from kgen.reference import evaluate, round_to

    plan = build_file(EXAMPLE)
    inputs = make_inputs(plan.kernel, dict(M=37, N=41, K=80), np.random.default_rng(5))
    a, b = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
    want = (a @ b) * inputs["sa"].astype(np.float64)[:, None] * inputs["sb"].astype(np.float64)
    got = evaluate(plan.kernel, inputs)["D"]
    assert np.array_equal(got.astype(np.float64), round_to(want, ir.DType.BF16))


# -- NVRTC ---------------------------------------------------------------------------------------


def _compiled(source: str, name: str, narrow: str, arch: str = "sm_89"):
    from kgen.runtime.nvrtc import compile_cubin, parse_ptxas_report

    result = compile_cubin(source, name, arch)
    narrow_report = parse_ptxas_report(result.log, narrow)
    return result, narrow_report


@pytest.mark.slow
@pytest.mark.parametrize("case", ["example", "mixed", "fp8_out", "amax"])
def test_compiles_for_sm_89_without_spills_and_holds_the_fp8_mma_sync(case, tmp_path,
                                                                      monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.api import build_file
    from kgen.runtime.nvrtc import compile_ptx

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    amax = (EXAMPLES / "gemm_fp8_out_amax.kg").read_text().replace("target sm_90a",
                                                                    "target sm_89")
    b = (build_file(EXAMPLE) if case == "example" else
         built(sm89_text(b="f8e5m2")) if case == "mixed" else
         built(sm89_text(out="f8e5m2")) if case == "fp8_out" else
         built(amax))  # an e4m3 output and reduce_absmax (not run on a GPU yet)
    result, narrow = _compiled(b.source, b.plan.name, b.plan.narrow_kernel)
    assert result.spill_stores == result.spill_loads == result.stack_bytes == 0, result.log
    assert "warning" not in result.log.lower(), result.log
    assert narrow.get("registers"), result.log
    assert narrow.get("spill_stores", 0) == 0 and narrow.get("stack_bytes", 0) == 0, result.log
    ptx = compile_ptx(b.source, b.plan.name, "sm_89")
    kinds = "e4m3.e5m2" if case == "mixed" else "e4m3.e4m3"
    assert set(re.findall(r"mma\.sync\.aligned\.\S+", ptx)) == {
        f"mma.sync.aligned.m16n8k32.row.col.f32.{kinds}.f32"}


@pytest.mark.slow
def test_every_sm_89_fp8_configuration_compiles_without_spills(tmp_path, monkeypatch):
    """Every configuration the tuner lists, both entry points, for sm_89 (an sm_90a build of
    the same source runs FP8 mma.sync with more registers: bench/fp8.py --sm89 says which
    spill there)."""
    pytest.importorskip("cuda.core")
    from kgen.api import build
    from kgen.lower import builder
    from kgen.targets import target

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    kernel = parse(sm89_text(), "f.kg").kernels[0]
    listed = builder.listed(kernel, target(ir.Arch.SM89), sizes={}, wide=True)
    assert len(listed) >= 15
    for config, filled, _ in listed:
        b = build(filled)
        result, narrow = _compiled(b.source, b.plan.name, b.plan.narrow_kernel)
        assert (result.spill_stores, narrow.get("spill_stores", 0)) == (0, 0), (config.label,
                                                                             result.log)
