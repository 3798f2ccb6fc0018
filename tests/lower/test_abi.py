"""The ABI pass: a fixed size that no contiguous tensor could run with is refused at its
declaration where the kernel has no narrow entry point (a chain); a one-gemm kernel takes it,
its narrow entry point running such tensors (issue 16: `K = 100` was accepted, then every
contiguous A refused at launch)."""
from __future__ import annotations

import pytest

from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.verify import verify

SOURCE = """kernel fixed_k {{
  target sm_80
  tensor A : {a}
  tensor B : {b}
  tensor D : {d} row out

  gemm mma0 = A @ B accumulate f32 {{
    tile 128x128x32  warps 2x2  stages 3
    epilogue {{ D = acc }}
  }}
}}
"""


def plan(a: str, b: str, d: str = "f16[M, N]"):
    module = parse(SOURCE.format(a=a, b=b, d=d), "k.kg")
    verify(module)
    return lower(module.kernels[0])


CHAIN = """kernel chain {{
  target sm_80
  tensor A : f16[M, {k}] row
  tensor B0 : f16[{k}, 64] col
  tensor B1 : f16[64, 128] col
  tensor D1 : f16[M, 128] row out
  gemm g0 = A @ B0 accumulate f32 {{
    tile 128x64x64  warps 8x1  stages 4
    epilogue {{ g0 = relu(acc) }}
  }}
  gemm g1 = g0 @ B1 accumulate f32 {{
    tile 128x128x32  warps 8x1  stages 3
    keep g0 in registers
    epilogue {{ D1 = relu(acc) }}
  }}
}}
"""


def test_a_chain_with_a_fixed_k_no_contiguous_operand_can_have_is_refused_where_declared():
    module = parse(CHAIN.format(k=100), "k.kg")
    verify(module)
    with pytest.raises(KgenError) as err:
        lower(module.kernels[0])
    assert (err.value.loc.line, err.value.loc.col) == (3, 3)
    assert "rows are 100 elements apart" in err.value.message
    assert "multiple of 8" in err.value.message


def test_a_one_gemm_kernel_takes_any_fixed_size_through_its_narrow_entry_point():
    for a, b, d in (("f16[M, 100] row", "f16[100, N] col", "f16[M, N]"),
                    ("f16[100, K] col", "f16[K, N] col", "f16[100, N]"),
                    ("f16[M, K] row", "f16[K, 129] col", "f16[M, 129]")):
        p = plan(a, b, d)
        assert p.narrow_kernel == "fixed_k_narrow"
    # an odd fixed N keeps its rule: the fast entry point never runs
    assert [(r.dim, r.multiple) for r in p.dim_rules] == [(129, 2)]


def test_fixed_sizes_in_whole_chunks_plan():
    assert plan("f16[M, 96] row", "f16[96, N] col").gemms[0].k_dim == 96
    assert plan("f16[104, K] col", "f16[K, N] col", "f16[104, N]").gemms[0].m_dim == 104


def test_an_operand_s_rule_says_how_it_loads():
    """cp.async on sm_80 (and wherever no tensor map loads it), the copy engine where the
    schedule loads it by TMA (sm_90a's warp-specialized kernel): in the plan, in inspect's
    table and in the .cu's checks."""
    from kgen.api import build_file
    from kgen.lower.abi import COPY_ENGINE, CP_ASYNC

    from tests.kernels import EXAMPLES

    example = next(p for p in EXAMPLES if p.name == "gemm_bias_relu.kg")
    for arch, reason in (("sm_80", CP_ASYNC), ("sm_90a", COPY_ENGINE)):
        built = build_file(example, arch)
        reasons = {a.param: a.reason for a in built.plan.alignments}
        assert reasons["A"] == reasons["B"] == reason, arch
        assert f'"A must be 16-byte aligned: {reason}"' in built.source
    assert "TMA" in COPY_ENGINE and "cp.async" not in COPY_ENGINE
    # a resident chain on sm_90a: wgmma, but its operands copied by cp.async (no tensor map)
    chain = build_file(next(p for p in EXAMPLES if p.name == "b2b_gemm_rf_sm90a.kg")).plan
    assert not chain.schedule.tensor_maps
    assert {a.reason for a in chain.alignments if a.param in ("A", "B0", "B1")} == {CP_ASYNC}


VECTORS = """kernel vectors {{
  target {arch}
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor C : f16[M, N] col
  tensor E : f32[M, N] col out
  tensor D : f16[M, N] row out
  vector r : f32[M]
  vector c : f32[N]
  gemm mma0 = A @ B accumulate f32 {{
    epilogue {{ t = acc * r[row] + c[col] + C; E = t; D = t }}
  }}
}}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_only_paired_accesses_ask_for_two_elements(arch):
    """The epilogue reads `c[col]` in pairs (load_pair) and D's columns in pairs; it reads
    `r[row]` and the `col` tensors C and E one element at a time: those need element alignment
    alone, which every argument has (the runtime checks it), so the .cu asks nothing more."""
    from kgen.api import build

    module = parse(VECTORS.format(arch=arch), "v.kg")
    verify(module)
    built = build(module.kernels[0])
    aligns = {a.param: (a.ptr_bytes, a.ld_multiple) for a in built.plan.alignments}
    assert aligns["c"] == (8, 1) and aligns["D"] == (4, 2)
    assert not {"r", "C", "E"} & set(aligns)
    source = built.source
    assert "p.r[row]" in source and "load_pair<kNarrow>(p.c + col, both)" in source
    assert "p.C[(col + 1) * p.ld_C + row]" in source and "p.E[(col + 0) * p.ld_E + row]" in source
    for name in ("r", "C", "E"):
        assert f"reinterpret_cast<unsigned long long>(p.{name}) %" not in source, name
    assert "reinterpret_cast<unsigned long long>(p.c) % 8 != 0" in source
