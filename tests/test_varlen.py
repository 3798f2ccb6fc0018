"""Packed variable-length sequences (`packed S by cu_seqlens_q`, issue 51), on the CPU: the
example parses and verifies, misuse is a located error, the plan addresses the packed
parameters per sequence, both skeletons read each batch's extents from the offsets (and NVRTC
compiles them), the runtime binds [H, total, D] arrays and int32 offsets, the NumPy reference
runs sequence by sequence, and kgen.attention_varlen's program text."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kgen import attention as dense
from kgen import attention_varlen as varlen
from kgen.api import build_verified
from kgen.enums import DType
from kgen.errors import ArgumentError, KgenError
from kgen.parse import parse
from kgen.reference import evaluate
from kgen.runtime.program import bind_program, encode_maps
from kgen.runtime.tensors import DeviceArray, contiguous_strides
from kgen.verify import verify_kernel

EXAMPLE = Path(__file__).parent.parent / "examples" / "attention_fwd_varlen.kg"


def kernel_of(text: str, file: str = "v.kg"):
    kernel = parse(text, file).kernels[0]
    verify_kernel(kernel)
    return kernel


def example(arch: str = "sm_90a", text: str | None = None):
    text = EXAMPLE.read_text() if text is None else text
    return build_verified(kernel_of(text.replace("target sm_90a", f"target {arch}")), arch)


def test_the_example_parses_and_plans_packed_rows_and_loop():
    kernel = kernel_of(EXAMPLE.read_text())
    assert [(p.dim, p.offsets) for p in kernel.packed] == [("S", "cu_seqlens_q"),
                                                          ("T", "cu_seqlens_k")]
    plan = example().plan
    assert [(d.dim, d.offsets, d.along) for d in plan.packed] == [
        ("S", "cu_seqlens_q", "rows"), ("T", "cu_seqlens_k", "loop")]
    along = {p.name: p.packed for p in plan.params}
    assert along == {"Q": "rows", "K": "loop", "V": "loop", "O": "rows", "lse": "rows",
                     "scale": None, "cu_seqlens_q": None, "cu_seqlens_k": None}
    assert plan.param("cu_seqlens_q").kind == "offsets"
    names = [f.name for f in plan.fields]
    assert names[-4:] == ["cu_seqlens_q", "rows_total", "cu_seqlens_k", "loop_total"]
    assert plan.bounds.bounds  # the causal bound still skips blocks, per sequence


def test_a_dense_kernel_plans_no_packing():
    text = EXAMPLE.read_text().replace("  packed S by cu_seqlens_q\n", "").replace(
        "  packed T by cu_seqlens_k\n", "")
    plan = example(text=text).plan
    assert plan.packed == () and all(p.packed is None for p in plan.params)
    assert "rows_total" not in [f.name for f in plan.fields]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_both_skeletons_read_each_sequences_extents(arch):
    src = example(arch).source
    for line in ("const int row_start = p.cu_seqlens_q[batch];",
                 "const int rows = p.cu_seqlens_q[batch + 1] - row_start;",
                 "const int loop_start = p.cu_seqlens_k[batch];",
                 "const int loop_len = p.cu_seqlens_k[batch + 1] - loop_start;",
                 "if (row0 >= rows) return;",
                 "g_O = p.O + row_start * p.O_ld + head * p.O_hs;",
                 "g_lse = p.lse + row_start + head * p.lse_hs;",
                 "const int* cu_seqlens_q;",
                 # the causal bound per sequence: T - S of this batch
                 "static_cast<float>(loop_len) + (-1.0f) * static_cast<float>(rows);"):
        assert line in src, line
    assert "p.rows" not in src.split("extern \"C\"")[1].split("#ifndef __CUDACC_RTC__")[0]
    if arch == "sm_90a":  # the copy engine reads at the sequence's start, maps over the total
        assert "q_full, box * 64, row_start + row0, q_head, q_batch);" in src
        assert "box * 64, loop_start + kv0, k_smem_head, k_smem_batch);" in src
        assert "static_cast<cuuint64_t>(p.rows_total);" in src
    else:
        assert "g_K = p.K + loop_start * p.K_ld + kv_head * p.K_hs;" in src


def test_a_dense_kernel_reads_its_sizes_once():
    text = EXAMPLE.read_text().replace("  packed S by cu_seqlens_q\n", "").replace(
        "  packed T by cu_seqlens_k\n", "")
    src = example("sm_80", text=text).source
    assert "const int rows = p.rows, loop_len = p.loop_len;" in src
    assert "row_start" not in src and "loop_start" not in src


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_both_skeletons_without_spills(arch, tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.runtime.nvrtc import compile_cubin

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    built = example(arch)
    result = compile_cubin(built.source, built.plan.name, arch)
    assert result.cubin[:4] == b"\x7fELF"
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


# ---------------------------------------------------------------------------------------------
# Misuse: located errors

BASE = EXAMPLE.read_text()


def _error(text: str) -> KgenError:
    with pytest.raises(KgenError) as info:
        kernel_of(text, "bad.kg")
    return info.value


def _line_of(text: str, needle: str) -> int:
    return next(i + 1 for i, line in enumerate(text.splitlines()) if needle in line)


@pytest.mark.parametrize("change, needle, message", [
    (("packed T by cu_seqlens_k", "packed T by cu_seqlens_k\n  packed S by cu_q2"),
     "packed S by cu_q2", "S is packed twice"),
    (("packed T by cu_seqlens_k", "packed HKV by cu_seqlens_k"), "packed HKV",
     "only the kernel's rows (S) and its loop's dimension (T)"),
    (("packed T by cu_seqlens_k", "packed D by cu_seqlens_k"), "packed D",
     "not a dimension of any parameter"),
    (("packed T by cu_seqlens_k", "packed T by scale"), "packed T by scale",
     "duplicate name 'scale'"),
    (("packed T by cu_seqlens_k", "packed T by cu_seqlens_q"), "packed T by cu_seqlens_q",
     "duplicate name 'cu_seqlens_q'"),
    (("packed T by cu_seqlens_k", "packed T by int"), "packed T by int", "int"),
    (("vector lse : f32[B, H, S] out", "vector lse : f32[B, H, S] out\n"
      "  tensor W : bf16[B, H, 128, S] row"), "tensor W", "among its columns"),
    (("vector lse : f32[B, H, S] out", "vector lse : f32[B, H, S] out\n"
      "  vector w : f32[S]"), "vector w", "no batch dimension"),
])
def test_misuse_is_a_located_error(change, needle, message):
    text = BASE.replace(*change)
    err = _error(text)
    assert message in err.message, err.message
    assert err.loc.file == "bad.kg" and err.loc.line == _line_of(text, needle), err.loc


def test_an_offsets_name_kgen_uses_is_refused_when_lowering():
    text = BASE.replace("packed T by cu_seqlens_k", "packed T by rows_total")
    with pytest.raises(KgenError) as info:
        build_verified(kernel_of(text, "bad.kg"), "sm_80")
    assert "collides with a member kgen adds" in info.value.message
    assert info.value.loc.line == _line_of(text, "packed T by rows_total")


def test_packed_in_a_gemm_kernel_is_refused_at_its_line():
    text = """kernel g {
  target sm_80
  tensor A : f16[B, M, K] row
  tensor Bm : f16[B, K, N] row
  tensor C : f16[B, M, N] row out
  packed M by offsets
  gemm mma0 = A @ Bm accumulate f32 { epilogue { C = acc } }
}
"""
    err = _error(text)
    assert "applies to loop kernels" in err.message and "gemm kernel" in err.message
    assert err.loc.line == 6


def test_a_col_major_packed_operand_is_refused():
    text = BASE.replace("tensor V : bf16[B, HKV, T, 128] row", "tensor V : bf16[B, HKV, T, 128] col")
    err = _error(text)
    assert "tensor 'V' is col" in err.message and err.loc.line == _line_of(text, "tensor V")


def test_a_malformed_packed_line_is_a_syntax_error():
    text = BASE.replace("packed T by cu_seqlens_k", "packed T cu_seqlens_k")
    err = _error(text)
    assert err.loc.line == _line_of(text, "packed T cu_seqlens_k")


# ---------------------------------------------------------------------------------------------
# The runtime's binding

ADDRESS = 1 << 20


def arr(shape, dtype=DType.BF16, strides=None):
    return DeviceArray(ADDRESS, tuple(shape), tuple(strides or contiguous_strides(shape)),
                       dtype, 0)


def offsets(n):
    return DeviceArray(ADDRESS, (n,), (1,), None, 0, dtype_name="int32")


def packed_args(h=8, hkv=2, total_q=1100, total_k=900, b=4):
    # FlashAttention's [total, H, D], seen as [H, total, D]
    def fa(total, heads):
        return arr((heads, total, 128), strides=(128, heads * 128, 1))
    return dict(Q=fa(total_q, h), K=fa(total_k, hkv), V=fa(total_k, hkv), O=fa(total_q, h),
                lse=arr((h, total_q), DType.F32), cu_seqlens_q=offsets(b + 1),
                cu_seqlens_k=offsets(b + 1))


def test_binding_packed_arrays_values_and_grid():
    plan = example().plan
    bound = bind_program(plan, packed_args(), {"S": 1000, "T": 700})
    v = dict(zip([f.name for f in plan.fields], bound.values))
    assert bound.grid == (math.ceil(1000 / plan.tile_m), 8, 4)
    assert (v["rows"], v["loop_len"], v["rows_total"], v["loop_total"]) == (1000, 700, 1100, 900)
    assert (v["Q_ld"], v["Q_hs"], v["Q_bs"]) == (8 * 128, 128, 0)
    assert (v["K_ld"], v["K_hs"], v["K_bs"]) == (2 * 128, 128, 0)
    assert (v["lse_hs"], v["lse_bs"]) == (1100, 0)
    assert (v["heads"], v["group"], v["batches"]) == (8, 4, 4)
    assert v["cu_seqlens_q"] == ADDRESS


def test_binding_without_the_longest_sequence_is_refused():
    plan = example().plan
    with pytest.raises(ArgumentError, match=r"sizes=\{'S': max_seqlen\}"):
        bind_program(plan, packed_args(), None)
    bound = bind_program(plan, packed_args(), {"S": 64})  # T: every sequence's together
    assert dict(zip([f.name for f in plan.fields], bound.values))["loop_len"] == 900


@pytest.mark.parametrize("name, value, match", [
    ("cu_seqlens_q", DeviceArray(ADDRESS, (5,), (1,), None, 0, dtype_name="int64"), "int32"),
    ("cu_seqlens_k", offsets(4), "B = 3; an earlier argument has B = 4"),
    ("Q", arr((4, 8, 1100, 128)), "must have 3 dims"),
    ("V", arr((2, 901, 128)), "holds 901 packed T-rows, but an earlier argument holds 900"),
    ("lse", arr((8, 1100, 1), DType.F32), "must have 2 dims"),
])
def test_binding_refuses_bad_packed_arguments(name, value, match):
    args = packed_args()
    args[name] = value
    with pytest.raises(ArgumentError, match=match):
        bind_program(example().plan, args, {"S": 1000})


def test_outputs_left_out_are_packed_and_maps_span_every_sequence():
    plan = example().plan
    args = packed_args()
    del args["O"], args["lse"]
    bound = bind_program(plan, args, {"S": 1000})
    assert bound.missing == {"O": (8, 1100, 128), "lse": (8, 1100)}
    pytest.importorskip("cuda.bindings")
    values = dict(zip([f.name for f in plan.fields], bind_program(
        plan, packed_args(), {"S": 1000}).values))
    calls = []
    from kgen.runtime import tma
    original = tma.encode_tiled
    try:
        tma.encode_tiled = lambda dtype, address, dims, pitches, box, l2: (
            calls.append((dims, pitches)) or bytes(tma.MAP_BYTES))
        encode_maps(plan, values, {"S": 1000, "T": 900})
    finally:
        tma.encode_tiled = original
    assert calls[0] == ([128, 1100, 8, 1], [8 * 128 * 2, 128 * 2, 128 * 2 * 8])  # Q
    assert calls[1][0] == [128, 900, 2, 1]  # K: its every row, one batch


# ---------------------------------------------------------------------------------------------
# The reference, sequence by sequence


def test_the_reference_is_the_dense_kernel_per_sequence():
    rng = np.random.default_rng(7)
    kernel = kernel_of(BASE)
    lengths_q, lengths_k = [1, 17, 40, 0], [5, 17, 33, 3]
    cu_q, cu_k = np.cumsum([0, *lengths_q]), np.cumsum([0, *lengths_k])
    h, hkv = 2, 1
    q = rng.standard_normal((h, cu_q[-1], 128)).astype(np.float32)
    k = rng.standard_normal((hkv, cu_k[-1], 128)).astype(np.float32)
    v = rng.standard_normal((hkv, cu_k[-1], 128)).astype(np.float32)
    out = evaluate(kernel, {"Q": q, "K": k, "V": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k},
                   {"scale": 0.1}, block=64)
    assert out["O"].shape == (h, cu_q[-1], 128) and out["lse"].shape == (h, cu_q[-1])
    dense_kernel = kernel_of(BASE.replace("  packed S by cu_seqlens_q\n", "").replace(
        "  packed T by cu_seqlens_k\n", ""))
    for b in range(len(lengths_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        one = evaluate(dense_kernel, {"Q": q[None, :, sq], "K": k[None, :, sk],
                                      "V": v[None, :, sk]}, {"scale": 0.1}, block=64)
        np.testing.assert_array_equal(out["O"][:, sq], one["O"][0])
        np.testing.assert_array_equal(out["lse"][:, sq], one["lse"][0])
    # sequence 0: one query, five keys, bottom-right: it sees them all
    assert np.isfinite(out["lse"][:, 0]).all()
    # sequence 2: 40 queries, 33 keys: the first 7 rows see no key (O = 0, lse = -inf)
    first = cu_q[2]
    assert (out["lse"][:, first:first + 7] == -np.inf).all()
    assert (out["O"][:, first:first + 7] == 0).all()
    assert np.isfinite(out["lse"][:, first + 7:cu_q[3]]).all()


# ---------------------------------------------------------------------------------------------
# kgen.attention_varlen's program


def test_the_python_entry_program_is_the_dense_one_packed():
    sig = dense.Signature("bf16", 128, 128, True, None, None, (), "sm_90a")
    text = varlen.program_text(sig)
    assert "  packed S by cu_seqlens_q\n  packed T by cu_seqlens_k\n  loop kv over T {" in text
    assert "x = where(col <= row + T - S, score, -inf)" in text
    assert text.startswith(f"kernel {varlen.name(sig)} {{") and varlen.name(sig) != sig.name
    plan = build_verified(varlen.program(sig), "sm_90a").plan
    assert plan.bounds.bounds and len(plan.packed) == 2
    plain = varlen.program_text(dense.Signature("bf16", 128, 128, False, None, None, ()))
    assert "x = score" in plain


def test_a_mistake_in_a_mod_is_located_in_the_mod():
    sig = dense.Signature("bf16", 64, 64, True, None, "col > row - nope", (), "sm_80")
    with pytest.raises(KgenError) as info:
        varlen.program(sig)
    assert info.value.loc.file == "mask_mod" and info.value.loc.col == 13


def test_kgen_run_refuses_packed_inputs_at_the_packed_line():
    from kgen.harness.run import run

    built = example("sm_80")
    with pytest.raises(KgenError) as info:
        run(built.kernel, built.plan, built.source)
    assert "does not make packed sequences' inputs" in info.value.message
    assert info.value.loc.line == _line_of(BASE, "packed S by cu_seqlens_q")
