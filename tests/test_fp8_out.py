"""FP8 outputs with amax (examples/gemm_fp8_out_amax.kg): verify takes an FP8 tensor output of
an FP8 gemm, the reference rounds it once and saturates it to the format's finite range, and
the sm_90a kernel stores saturating pairs (bytes in the narrow entry point) beside the amax
reduction."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kgen import ir

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gemm_fp8_out_amax.kg"


@pytest.mark.parametrize("dtype, top", [(ir.DType.F8E4M3, 448.0), (ir.DType.F8E5M2, 57344.0)])
def test_the_reference_saturates_fp8_to_its_finite_range(dtype, top):
    from kgen.reference import round_to

    got = round_to(np.array([1e6, -1e6, top * 1.01, 1.0625, np.nan]), dtype)
    assert got[:3].tolist() == [top, -top, top]
    assert got[3] in (1.0, 1.125) and np.isnan(got[4])


def test_the_reference_stores_y_and_amax():
    from kgen.api import build_file
    from kgen.harness.inputs import make_inputs
    from kgen.reference import evaluate, round_to

    kernel = build_file(EXAMPLE).kernel
    inputs = make_inputs(kernel, dict(M=40, N=64, K=256), np.random.default_rng(2))
    out = evaluate(kernel, inputs, {"scale_out": 300.0})
    a, b = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
    d = (a @ b) * inputs["sa"].astype(np.float64)[:, None] * inputs["sb"].astype(np.float64)
    assert out["Y"].dtype.name == "float8_e4m3fn"
    assert np.array_equal(out["Y"].astype(np.float64),
                          round_to(d * np.float64(np.float32(300.0)), ir.DType.F8E4M3))
    assert (np.abs(out["Y"].astype(np.float64)) == 448.0).any()  # some saturate
    assert np.isclose(float(out["amax"].reshape(-1)[0]), np.abs(d).max(), rtol=1e-6)


def test_the_kernel_stages_the_fp8_output_and_folds_amax_per_warp():
    """The fast entry point stages Y (saturated and scaled in registers) for the copy engine in
    64x128 boxes of 128-byte rows and folds amax into each thread's partial over the CTA's
    walk, one atomic per consumer warp at its end; the narrow entry point keeps the saturating
    byte-pair stores and the per-tile reduction."""
    from kgen.api import build_file
    from kgen.plan import StorePath

    built = build_file(EXAMPLE)
    gs = built.plan.schedule.gemms[0]
    assert gs.output.path is StorePath.TMA and "byte pairs" in gs.output.why
    assert built.plan.init_kernel == "gemm_fp8_out_amax_init"
    (y_map,) = [m for m in built.plan.schedule.tensor_maps if m.param == "Y"]
    assert y_map.store and y_map.box == (128, 64)
    source = built.source
    fast = source.split("// no copy engine: pair stores")[1].split("} else {", 1)[1]
    assert "constexpr int kBoxesN = kTileN / 128;" in source
    assert "st_shared_b16(box + staging_offset_bytes(r % 64 + 8 * h, c % 128), pair);" in fast
    assert "const __nv_fp8x2_e4m3 packed = __nv_fp8x2_e4m3(make_float2(" in source
    assert "return packed.__x;" in source
    assert "float& red0_0, float& red0_1) {" in source  # the packed function's reduced values
    assert "if (in) red0_walk = ReduceAbsMax::combine(red0_walk," in fast
    assert "n0 + box * 128, m0 + row0 + i * 64);" in fast
    assert "const bool whole_chunks = n0 + kTileN <= N || N % 16 == 0;" in fast
    assert "float red0_walk = ReduceAbsMax::identity();" in source
    assert "reduce_warp<ReduceAbsMax>(red0_walk, p.amax, lane);" in source
    assert "reduce_all<" not in fast.split("tma_store_box(&maps.Y")[0]  # no per-tile barrier
    # the narrow entry point: saturating byte pairs and the tile's reduction
    assert "store_pair<kNarrow>(p.Y + row * p.ld_Y + col, __nv_fp8x2_e4m3(make_float2(" in source
    assert "store_pair_bytes<kNarrow>(at, pair.__x, both);" in source
    assert "reduce_all<ReduceAbsMax, true>(red0_part, p.amax," in source
    # the launch: Y's rows are 16-byte multiples for the copy engine (16 elements)
    assert "the leading dimension of Y must be a multiple of 16 elements" in source


def _built_text(text):
    from kgen.api import build
    from kgen.parse import parse

    return build(parse(text, "f.kg").kernels[0], source_name="f.kg")


def test_an_e5m2_output_stages_alike():
    built = _built_text(EXAMPLE.read_text().replace("tensor Y : f8e4m3[M, N] row out",
                                                    "tensor Y : f8e5m2[M, N] row out"))
    from kgen.plan import StorePath

    assert built.plan.schedule.gemms[0].output.path is StorePath.TMA
    assert "const __nv_fp8x2_e5m2 packed = __nv_fp8x2_e5m2(make_float2(" in built.source


def test_an_fp8_output_without_amax_stages_too():
    text = EXAMPLE.read_text().replace("      amax = reduce_absmax(d)\n", "").replace(
        "  scalar amax : f32 out\n", "")
    built = _built_text(text)
    from kgen.plan import StorePath

    assert built.plan.schedule.gemms[0].output.path is StorePath.TMA
    assert "red0" not in built.source and "float& red" not in built.source


def test_a_tile_n_off_the_byte_box_keeps_pair_stores_and_says_why():
    text = EXAMPLE.read_text().replace(
        "  gemm mma0 = A @ B accumulate f32 {\n",
        "  gemm mma0 = A @ B accumulate f32 {\n    tile 128x192x128  warps 2x4  stages 4\n")
    built = _built_text(text)
    from kgen.plan import StorePath

    out = built.plan.schedule.gemms[0].output
    assert out.path is StorePath.PAIRS and "128-column box" in out.why


def test_deterministic_reductions_stay_per_tile():
    """Deterministic mode writes each tile's partial to its workspace slot: no walk partial."""
    text = EXAMPLE.read_text().replace("  target sm_90a\n", "  target sm_90a\n  reductions deterministic\n")
    built = _built_text(text)
    source = built.source
    assert "red0_walk" not in source and "reduce_warp" not in source
    fast = source.split("// no copy engine: pair stores")[1].split("} else {", 1)[1]
    assert "if (in) red0_part = ReduceAbsMax::combine(red0_part," in fast
    assert "reduce_all<ReduceAbsMax, false>(red0_part, p.workspace" in fast


def test_a_16_bit_output_beside_a_reduction_keeps_pair_stores():
    """Staging beside reductions is built for 8-bit outputs only; a 16-bit one keeps its path."""
    text = (EXAMPLE.read_text().replace("tensor Y : f8e4m3[M, N] row out",
                                        "tensor Y : bf16[M, N] row out"))
    built = _built_text(text)
    from kgen.plan import StorePath

    assert built.plan.schedule.gemms[0].output.path is StorePath.PAIRS
    assert built.plan.gemms[0].epilogue.staged_store is None


@pytest.mark.slow
def test_the_staged_kernel_compiles_without_spills(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.api import build_file
    from kgen.runtime.nvrtc import compile_cubin

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    b = build_file(EXAMPLE)
    assert "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " in b.source
    for entry in (b.plan.name, b.plan.name + "_narrow"):
        result = compile_cubin(b.source, entry, "sm_90a")
        assert result.spill_stores == 0 and result.spill_loads == 0 and result.stack_bytes == 0
        assert "warning" not in result.log.lower(), result.log


def test_the_16_bit_kernels_do_not_carry_the_fp8_pair_stores():
    from kgen.api import build_file

    root = EXAMPLE.parent
    for name in ("gemm_fp8_rowwise.kg", "gemm_fp8_blockwise.kg"):
        assert "store_pair_bytes" not in build_file(root / name).source


def test_an_fp8_output_is_never_added_into():
    from kgen.errors import KgenError
    from kgen.parse import parse
    from kgen.verify import verify

    text = EXAMPLE.read_text().replace("tensor Y : f8e4m3[M, N] row out",
                                       "tensor Y : f8e4m3[M, N] row out accumulate")
    with pytest.raises(KgenError):
        verify(parse(text, "f.kg"))


def test_the_gpu_tests_c_input_is_added_into_y():
    """tests/gpu/test_fp8_out_gpu.py's C-input kernel adds C into Y: its staged and narrow
    epilogues read C at the pair's (row, col), guarded in the staging, and the reference's Y is
    e4m3(d * scale_out + C). (Its first text replaced the header comment's "Y = d * scale_out",
    so the kernel dropped C while the GPU test's float64 Y added it.)"""
    from kgen.api import build
    from kgen.harness.inputs import make_inputs
    from kgen.parse import parse
    from kgen.reference import evaluate, round_to
    from tests.gpu.test_fp8_out_gpu import c_input_text

    kernel = parse(c_input_text(), "gemm_fp8_out_c.kg").kernels[0]
    inputs = make_inputs(kernel, dict(M=40, N=64, K=256), np.random.default_rng(3))
    out = evaluate(kernel, inputs, {"scale_out": 96.0})
    a, b = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
    d = (a @ b) * inputs["sa"].astype(np.float64)[:, None] * inputs["sb"].astype(np.float64)
    c = inputs["C"].astype(np.float64)
    assert np.abs(c).max() > 0.5  # C moves Y by more than a rounding step somewhere
    want = round_to(d * 96.0 + c, ir.DType.F8E4M3)
    assert np.array_equal(out["Y"].astype(np.float64), want)
    assert np.isclose(float(out["amax"].reshape(-1)[0]), np.abs(d).max(), rtol=1e-6)

    source = build(kernel, source_name="gemm_fp8_out_c.kg").source
    packed = source.split("__device__ __forceinline__ unsigned mma0_epilogue_packed(")[1]
    packed = packed.split("\n}\n")[0]
    assert "const __nv_bfloat162 v7 = load_pair<false>(p.C + row * p.ld_C + col, both);" in packed
    assert "const float v8_0 = v6_0 + v7_0;" in packed
    assert "__nv_fp8x2_e4m3(make_float2(v8_0, v8_1));" in packed
    fast = source.split("// no copy engine: pair stores")[1].split("} else {", 1)[1]
    assert ("const unsigned pair = in ? mma0_epilogue_packed(p, m0 + row0 + r + 8 * h, n0 + c, "
            "acc[i][j][2 * h], acc[i][j][2 * h + 1],") in fast
    assert "st_shared_b16(box + staging_offset_bytes(r % 64 + 8 * h, c % 128), pair);" in fast
    narrow = source.split("__device__ __forceinline__ void mma0_epilogue(")[1].split("\n}\n")[0]
    assert "load_pair<kNarrow>(p.C + row * p.ld_C + col, both);" in narrow
    assert "__nv_fp8x2_e4m3(make_float2(v8_0, v8_1)), both);" in narrow
