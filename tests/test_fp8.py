"""FP8 operands (f8e4m3, f8e5m2): the DSL's dtypes, verify's located refusals, the float64
reference of the dequantized operands, the sm_90a plan (wgmma's k32 FP8 family on the
warp-specialized kernel, 128-byte k tiles) and its emission; NVRTC compiles of the FP8 examples
without spills, their PTX holding the FP8 wgmma (slow)."""
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
# the sm_90a (wgmma) examples; sm_89's (mma.sync) is tests/test_fp8_sm89.py's
FP8_EXAMPLES = sorted(p for p in EXAMPLES.glob("gemm_fp8_*.kg")
                      if "target sm_90a" in p.read_text())

TEXT = """\
kernel f {
  target TARGET
  tensor A : ADT[M, K] ALAYOUT
  tensor B : BDT[K, N] BLAYOUT
  tensor D : bf16[M, N] row out
  vector sa : f32[M]
  vector sb : f32[N]
  gemm g = A @ B accumulate f32 {
    LINES
    epilogue { D = EPILOGUE }
  }
}
"""


def fp8_text(target="sm_90a", a="f8e4m3", b="f8e4m3", a_layout="row", b_layout="col",
             lines="", epilogue="acc * sa[row] * sb[col]", extra=""):
    text = (TEXT.replace("TARGET", target).replace("ADT", a).replace("BDT", b)
            .replace("ALAYOUT", a_layout).replace("BLAYOUT", b_layout)
            .replace("LINES", lines).replace("EPILOGUE", epilogue))
    return text.replace("  vector sa", extra + "  vector sa") if extra else text


def kernel_of(text: str) -> ir.Kernel:
    return parse(text, "f.kg").kernels[0]


def refusal(text: str) -> KgenError:
    with pytest.raises(KgenError) as info:
        verify(parse(text, "f.kg"))
    return info.value


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# -- the dtypes -------------------------------------------------------------------------------


def test_fp8_dtypes_parse_with_their_sizes():
    k = kernel_of(fp8_text(a="f8e4m3", b="f8e5m2"))
    assert k.param("A").dtype is ir.DType.F8E4M3 and k.param("B").dtype is ir.DType.F8E5M2
    assert ir.DType.F8E4M3.nbytes == ir.DType.F8E5M2.nbytes == 1
    assert ir.DType.F8E4M3.fp8 and ir.DType.F8E5M2.fp8 and not ir.DType.BF16.fp8
    assert ir.DType.from_name("f8e4m3") is ir.DType.F8E4M3


def test_fp8_names_are_reserved():
    text = fp8_text().replace("vector sa", "vector f8e4m3").replace("sa[row]", "f8e4m3[row]")
    assert "reserved" in str(refusal(text)) or "keyword" in str(refusal(text))


def test_the_fp8_example_verifies():
    for path in FP8_EXAMPLES:
        verify(parse(path.read_text(), path.name))


# -- verify's rules, each located --------------------------------------------------------------


def test_fp8_needs_an_fp8_target():
    text = fp8_text(target="sm_80")
    err = refusal(text)
    assert ("FP8 operands need FP8 tensor cores, target sm_89 (mma.sync m16n8k32) or sm_90a; "
            "sm_80's mma.sync takes 16-bit operands only") in str(err)
    assert err.loc.line == line_of(text, "gemm g")


@pytest.mark.parametrize("target", ["sm_86"])
def test_fp8_on_other_targets_says_what_is_missing(target):
    assert f"{target}'s mma.sync takes 16-bit operands only" in str(refusal(
        fp8_text(target=target)))


def test_an_mn_major_fp8_b_is_refused_at_its_operand():
    text = fp8_text(b_layout="row")
    err = refusal(text)
    assert "FP8 operand B 'B' at line 4 is row-major" in str(err)
    assert "wgmma reads 8-bit operands K-major only" in str(err)
    assert "declare it col" in str(err)
    assert err.loc.line == line_of(text, "gemm g")  # the gemm's B operand: A @ B
    assert err.loc.col == text.splitlines()[err.loc.line - 1].index("@ B") + 3


def test_an_mn_major_fp8_a_is_refused():
    err = refusal(fp8_text(a_layout="col"))
    assert "FP8 operand A 'A' at line 3 is col-major" in str(err) and "declare it row" in str(err)


def test_fp8_with_a_16_bit_operand_is_refused():
    err = refusal(fp8_text(b="bf16"))
    assert "operand dtypes differ: B is bf16" in str(err) and "two FP8 operands" in str(err)


def test_fp8_accumulates_in_f32():
    err = refusal(fp8_text().replace("accumulate f32", "accumulate f16"))
    assert "accumulate" in str(err) and "f16" in str(err)


def test_fp8_vectors_and_outputs_are_refused():
    err = refusal(fp8_text().replace("vector sa : f32[M]", "vector sa : f8e4m3[M]"))
    assert "vector 'sa' must be f16, bf16 or f32, got f8e4m3" in str(err)
    # an FP8 tensor output is an FP8 gemm's (examples/gemm_fp8_out_amax.kg), never a 16-bit one's
    verify(parse(fp8_text().replace("tensor D : bf16[M, N] row out",
                                    "tensor D : f8e4m3[M, N] row out"), "f.kg"))
    text = (fp8_text(a="bf16", b="bf16", b_layout="row")
            .replace("tensor D : bf16[M, N] row out", "tensor D : f8e5m2[M, N] row out"))
    err = refusal(text)
    assert "'D' is f8e5m2: an FP8 output is written by an FP8 gemm's epilogue" in str(err)
    assert err.loc.line == line_of(text, "epilogue")


def test_an_epilogue_cannot_read_an_fp8_tensor():
    text = fp8_text(epilogue="acc + C", extra="  tensor C : f8e4m3[M, N] row\n")
    err = refusal(text)
    assert "an FP8 tensor is a gemm operand only" in str(err)
    assert err.loc.line == line_of(text, "epilogue")


def test_tile_programs_refuse_fp8_tensors():
    """A row kernel or a loop kernel reads its tensors in its own code: FP8 is a gemm
    kernel's operand type only (refused at the declaration)."""
    row = ("kernel rk {\n  target sm_90a\n  tensor X : f8e4m3[M, 64] row\n"
           "  tensor Y : bf16[M, 64] row out\n  epilogue { Y = X * 2.0 }\n}\n")
    err = refusal(row)
    assert "FP8 tensors are operands of a kernel's gemms" in str(err) and err.loc.line == 3
    attention = (EXAMPLES / "attention_fwd.kg").read_text()
    q = next(line for line in attention.splitlines() if line.strip().startswith("tensor Q"))
    err = refusal(attention.replace(q, q.replace("bf16", "f8e4m3")))
    assert "FP8 tensors are operands of a kernel's gemms" in str(err)
    assert err.loc.line == line_of(attention, "tensor Q")


def test_a_cast_to_fp8_is_refused():
    err = refusal(fp8_text(epilogue="cast<f8e4m3>(acc)"))
    assert "FP8 values in an epilogue (FP8 outputs) are not built yet" in str(err)


# -- the reference: the dequantized operands in float64 ------------------------------------------


def _e4m3(code: int) -> float:
    """OCP e4m3 (fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN, no
    infinity."""
    s, e, m = code >> 7, code >> 3 & 0xF, code & 7
    if e == 0xF and m == 7:
        return float("nan")
    v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


def _e5m2(code: int) -> float:
    """e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE infinities and NaNs."""
    s, e, m = code >> 7, code >> 2 & 0x1F, code & 3
    if e == 0x1F:
        v = float("inf") if m == 0 else float("nan")
    else:
        v = m / 4 * 2.0 ** -14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15)
    return -v if s else v


@pytest.mark.parametrize("dtype, decode", [(ir.DType.F8E4M3, _e4m3), (ir.DType.F8E5M2, _e5m2)])
def test_host_fp8_arrays_decode_exactly(dtype, decode):
    """The host dtype the reference reads decodes all 256 codes to the format's exact values
    (e4m3's largest 448, e5m2's 57344)."""
    from kgen.reference import host_dtype

    codes = np.arange(256, dtype=np.uint8)
    got = codes.view(host_dtype(dtype)).astype(np.float64)
    want = np.array([decode(int(c)) for c in codes])
    assert np.array_equal(got, want, equal_nan=True)
    assert np.nanmax(got[np.isfinite(got)]) == {ir.DType.F8E4M3: 448.0,
                                                ir.DType.F8E5M2: 57344.0}[dtype]


def test_reference_is_the_dequantized_product_scaled():
    from kgen.api import build_file
    from kgen.harness.inputs import make_inputs
    from kgen.reference import evaluate, round_to

    built = build_file(EXAMPLES / "gemm_fp8_rowwise.kg")
    inputs = make_inputs(built.kernel, dict(M=33, N=40, K=96), np.random.default_rng(3))
    assert inputs["A"].dtype.name == "float8_e4m3fn" and inputs["B"].dtype.name == "float8_e4m3fn"
    a, b = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
    want = (a @ b) * inputs["sa"].astype(np.float64)[:, None] * inputs["sb"].astype(np.float64)
    got = evaluate(built.kernel, inputs)["D"]
    assert np.array_equal(got.astype(np.float64), round_to(want, ir.DType.BF16))


# -- the plan and its emission ------------------------------------------------------------------


def _built(text: str):
    from kgen.api import build

    return build(kernel_of(text), source_name="f.kg")


def test_fp8_plans_the_cooperative_wgmma_kernel_with_128_byte_k_tiles():
    from kgen.plan import KernelKind, LoadPath, Mma

    built = _built(fp8_text())
    plan, g = built.plan, built.plan.gemms[0]
    s = plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert s.gemms[0].pipeline.a.load is LoadPath.TMA and s.gemms[0].pipeline.b.load is LoadPath.TMA
    assert g.tile[2] == 128  # 128 bytes of 8-bit elements per k tile row
    # the stages hold 1-byte elements: (128 + 256) x 128 bytes each
    ring = [b for b in plan.storage.buffers if b.name in ("a_smem", "b_smem")]
    assert sum(b.bytes for b in ring) == g.stages * (g.tile[0] + g.tile[1]) * g.tile[2]
    assert plan.storage.total_bytes <= plan.storage.limit_bytes


def test_the_builder_lists_only_wgmma_configs_of_tile_k_128():
    from kgen.lower.builder import shapes as gemm_shapes
    from kgen.targets import configs, target

    shapes = gemm_shapes(kernel_of(fp8_text()))
    assert shapes[0].dtype.fp8
    for wide in (False, True):
        listed = configs(target(ir.Arch.SM90A), shapes, sizes={}, wide=wide)
        assert listed and all(c.gemms[0].tile[2] == 128 for c in listed)
        assert all(c.gemms[0].warps == (2, 4) for c in listed)  # the consumer warpgroups'


def test_a_16_bit_k_tile_is_refused_for_fp8():
    text = fp8_text(lines="tile 128x256x64  warps 2x4  stages 4")
    with pytest.raises(KgenError) as info:
        _built(text)
    message = str(info.value)
    assert "128-byte k tiles (tile K 128 for 8-bit operands), not 64" in message
    assert "FP8 operands run on the warp-specialized kernel only" in message
    assert info.value.loc.line == line_of(text, "tile 128x256x64")


@pytest.mark.parametrize("a, b", [("f8e4m3", "f8e4m3"), ("f8e4m3", "f8e5m2"),
                                  ("f8e5m2", "f8e4m3"), ("f8e5m2", "f8e5m2")])
def test_emission_holds_the_fp8_wgmma(a, b):
    names = {"f8e4m3": "e4m3", "f8e5m2": "e5m2"}
    source = _built(fp8_text(a=a, b=b)).source
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n256k32\.f32\.{names[a]}\.{names[b]} ",
                     source)
    assert "accumulate, 1, 1;" in source  # no transpose operands for 8-bit types
    assert "k16" not in source.split("wgmma_step")[1].split("}")[0]
    assert "kk < kTileK / 32" in source
    assert "CU_TENSOR_MAP_DATA_TYPE_UINT8" in source
    assert "#include <cuda_fp8.h>" in source
    assert "const __nv_fp8_e4m3* A;" in source or "const __nv_fp8_e5m2* A;" in source
    assert "copy_granule_8bit(p.A, p.ld_A)" in source


PROMOTED = "tile 128x128x128  warps 2x4  stages 6"


def test_a_128x128_fp8_tile_promotes_every_k_tile():
    """Two-level accumulation: a consumer's 64 accumulators leave room for wgmma's own set,
    promoted into them every k tile (a Schedule value with its why)."""
    built = _built(fp8_text(lines=PROMOTED))
    promotion = built.plan.schedule.gemms[0].promotion
    assert promotion.k_tiles == 1 and "14 mantissa bits" in promotion.why
    source = built.source
    assert "constexpr int kPromoteTiles = 1;" in source
    assert "float period_acc[kFragM][kFragN][4];" in source
    assert "wgmma_step(period_acc[i]," in source and "kk > 0 || kt % kPromoteTiles != 0);" in source
    assert "acc[i][j][e] += period_acc[i][j][e];" in source
    assert '"r"(accumulate)' in source
    rows = built.plan.schedule.gemms[0].describe()
    assert any(r[0] == "g promotion" and r[1] == "every 1 k tile" for r in rows)


def test_a_wide_fp8_tile_is_not_promoted_and_says_why():
    built = _built(fp8_text())  # the builder's 128x256: 128 accumulators per consumer thread
    promotion = built.plan.schedule.gemms[0].promotion
    assert promotion.k_tiles == 0 and "128 accumulators leave no registers" in promotion.why
    assert "period_acc" not in built.source and '"r"(1)' in built.source


def test_16_bit_kernels_are_never_promoted():
    from kgen.api import build_file
    from kgen.plan import AccPromotion

    built = build_file(EXAMPLES / "gemm.kg", "sm_90a")
    assert built.plan.schedule.gemms[0].promotion == AccPromotion()
    assert not any("promotion" == r[0].split()[-1] for r in built.plan.schedule.gemms[0].describe())


def test_16_bit_kernels_do_not_include_cuda_fp8():
    from kgen.api import build_file

    assert "cuda_fp8.h" not in build_file(EXAMPLES / "gemm.kg", "sm_90a").source


WRITTEN = {"promoted": PROMOTED, "split": "tile 128x128x128  warps 2x4  stages 5  split 4",
           "stream": "tile 128x256x128  warps 2x4  stages 3  split stream",
           "cluster": "tile 128x256x128  warps 2x4  stages 4  cluster 2x1"}


@pytest.mark.slow
@pytest.mark.parametrize("path", FP8_EXAMPLES + ["mixed", *WRITTEN],
                         ids=lambda p: getattr(p, "stem", p))
def test_fp8_compiles_with_nvrtc_without_spills_and_holds_the_fp8_wgmma(path, tmp_path,
                                                                         monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.api import build_file
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx, parse_ptxas_report

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    built = (_built(fp8_text(a="f8e4m3", b="f8e5m2")) if path == "mixed" else
             _built(fp8_text(lines=WRITTEN[path])) if path in WRITTEN else build_file(path))
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log
    assert result.stack_bytes == 0, result.log
    assert "warning" not in result.log.lower(), result.log
    narrow = parse_ptxas_report(result.log, built.plan.narrow_kernel)
    assert narrow.get("registers"), result.log
    assert narrow.get("spill_stores", 0) == 0 and narrow.get("stack_bytes", 0) == 0, result.log
    ptx = compile_ptx(built.source, built.plan.name, "sm_90a")
    wgmma = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.\S+", ptx))
    kinds = "e4m3.e5m2" if path == "mixed" else "e4m3.e4m3"
    # the builder's tile N: 256; 128 for the promoted written schedules; with block scales the
    # builder's 128x192 in period halves of 96 columns
    n = {"promoted": 128, "split": 128, "gemm_fp8_blockwise": 96}.get(getattr(path, "stem", path),
                                                                    256)
    assert wgmma == {f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.{kinds}"}, wgmma


def test_fp8_lowered_for_a_target_without_wgmma_is_refused_at_its_gemm():
    """Verified for its own target (sm_90a), lowered for sm_80 (`--arch`): the rulebook's
    request rule refuses it, located, before any mma.sync plan is emitted."""
    from kgen.api import build_file

    with pytest.raises(KgenError) as info:
        build_file(EXAMPLES / "gemm_fp8_rowwise.kg", "sm_80")
    assert "FP8 operands need FP8 tensor cores, target sm_89" in str(info.value)
    assert "lowered for sm_80" in str(info.value)
    text = (EXAMPLES / "gemm_fp8_rowwise.kg").read_text()
    assert info.value.loc.line == line_of(text, "gemm mma0")


# -- binding FP8 arguments (fake device arrays: no GPU needed) -----------------------------------


def _array(shape, dtype, strides=None, ptr=0x7F10_0000_0000):
    from kgen.runtime.tensors import DeviceArray, contiguous_strides

    return DeviceArray(ptr=ptr, shape=shape, strides=strides or contiguous_strides(shape),
                       dtype=dtype, device_id=None, dtype_name=dtype.dsl_name if dtype else "u8")


def _fp8_args(m, n, k, **changes):
    e4m3, f32 = ir.DType.F8E4M3, ir.DType.F32
    args = dict(A=_array((m, k), e4m3, ptr=0x7F10_0000_0000),
                B=_array((k, n), e4m3, strides=(1, k), ptr=0x7F20_0000_0000),
                D=_array((m, n), ir.DType.BF16, ptr=0x7F30_0000_0000),
                sa=_array((m,), f32, ptr=0x7F40_0000_0000),
                sb=_array((n,), f32, ptr=0x7F50_0000_0000))
    args.update(changes)
    return args


def test_fp8_arguments_bind_with_byte_rows():
    from kgen.api import build_file
    from kgen.runtime.launch import bind_arguments, params_struct

    plan = build_file(EXAMPLES / "gemm_fp8_rowwise.kg").plan
    bound = bind_arguments(plan, _fp8_args(1000, 512, 4096), device_of=lambda ptr: None)
    assert bound.sizes == {"M": 1000, "K": 4096, "N": 512} and bound.narrow == ""
    assert (bound.values["ld_A"], bound.values["ld_B"]) == (4096, 4096)
    struct = params_struct(plan)(**bound.values)
    assert struct.A == 0x7F10_0000_0000
    # rows of 40 bytes miss the copy engine's 16-byte rule: the narrow entry point runs them
    narrow = bind_arguments(plan, _fp8_args(1000, 512, 40), device_of=lambda ptr: None).narrow
    assert "leading dimension 40 is not a multiple of 16" in narrow


def test_fp8_arguments_of_another_dtype_are_refused():
    from kgen.api import build_file
    from kgen.errors import ArgumentError
    from kgen.runtime.launch import bind_arguments

    plan = build_file(EXAMPLES / "gemm_fp8_rowwise.kg").plan
    wrong = _fp8_args(64, 64, 64, B=_array((64, 64), ir.DType.F8E5M2, strides=(1, 64)))
    with pytest.raises(ArgumentError, match="B must be f8e4m3"):
        bind_arguments(plan, wrong, device_of=lambda ptr: None)


def test_torch_fp8_tensors_map_to_the_fp8_dtypes():
    torch = pytest.importorskip("torch")
    from kgen.harness.torch_eval import torch_dtype
    from kgen.runtime.tensors import _TORCH_NAMES

    for dtype in (ir.DType.F8E4M3, ir.DType.F8E5M2):
        assert _TORCH_NAMES[str(torch_dtype(dtype))] is dtype


@pytest.mark.slow
def test_every_fp8_configuration_compiles_without_spills(tmp_path, monkeypatch):
    """Every configuration the tuner lists for an FP8 gemm, in both entry points (the narrow
    producer's 8-bit copies spilled at 128x64, 64x128 and 256x152 before they were cut to
    16-byte and 1-byte ones)."""
    pytest.importorskip("cuda.core")
    from kgen.api import build
    from kgen.lower import builder
    from kgen.runtime.nvrtc import compile_cubin, parse_ptxas_report
    from kgen.targets import target

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    kernel = kernel_of(fp8_text())
    listed = builder.listed(kernel, target(ir.Arch.SM90A), sizes={}, wide=True)
    assert len(listed) >= 20
    for config, filled, _ in listed:
        built = build(filled)
        result = compile_cubin(built.source, built.plan.name, "sm_90a")
        narrow = parse_ptxas_report(result.log, built.plan.narrow_kernel)
        assert (result.spill_stores, narrow.get("spill_stores", 0)) == (0, 0), (config.label,
                                                                             result.log)


@pytest.mark.parametrize("b1, message", [
    ("bf16", "every stage of a chain must use one operand dtype (g0 f8e4m3, g1 bf16)"),
    ("f8e4m3", "gemm 'g1' has FP8 B 'B1' but its A is gemm 'g0': a chained gemm's operands are "
               "f16 or bf16"),
])
def test_fp8_chains_are_refused(b1, message):
    text = (EXAMPLES / "b2b_gemm_rf_pingpong_bf16_sm90a.kg").read_text()
    text = (text.replace("tensor A : bf16", "tensor A : f8e4m3")
            .replace("tensor B0 : bf16", "tensor B0 : f8e4m3")
            .replace("tensor B1 : bf16", f"tensor B1 : {b1}"))
    with pytest.raises(KgenError) as info:
        from kgen.api import build

        build(kernel_of(text))
    assert message in str(info.value)
    assert info.value.loc.line == line_of(text, "gemm g1")
