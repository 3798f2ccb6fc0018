"""The ABI pass: a fixed size that no contiguous tensor could run with is refused at its
declaration (issue 16: `K = 100` was accepted, then every contiguous A refused at launch)."""
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


def test_fixed_k_that_no_contiguous_operand_can_have_is_refused_where_declared():
    with pytest.raises(KgenError) as err:
        plan("f16[M, 100] row", "f16[100, N] col")
    assert (err.value.loc.line, err.value.loc.col) == (3, 3)
    assert "rows are 100 elements apart" in err.value.message
    assert "multiple of 8" in err.value.message


def test_a_col_operand_is_judged_by_its_columns():
    """A `col` [M, K] tensor keeps each column's M elements together: a fixed M of 100."""
    with pytest.raises(KgenError, match="columns are 100 elements apart"):
        plan("f16[100, K] col", "f16[K, N] col", "f16[100, N]")


def test_fixed_sizes_in_whole_chunks_plan():
    assert plan("f16[M, 96] row", "f16[96, N] col").gemms[0].k_dim == 96
    assert plan("f16[104, K] col", "f16[K, N] col", "f16[104, N]").gemms[0].m_dim == 104
