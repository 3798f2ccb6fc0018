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
