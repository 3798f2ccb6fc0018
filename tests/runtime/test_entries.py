"""kgen/runtime/entries.py on the CPU: what needs no driver. The entry points' loading and the
narrow entry point's compile on demand run in the GPU tests (tests/gpu/test_narrow_mixed_gpu.py,
test_any_shape_gpu.py: every narrow launch there goes through it)."""
from __future__ import annotations

import pytest

from kgen.api import build_file
from kgen.errors import KgenRuntimeError
from kgen.runtime.entries import DEFAULT_SMEM_LIMIT, allow_smem, compile_narrow, function_of

from tests.runtime.test_any_shape import EXAMPLES


def test_no_name_is_no_function_and_small_plans_need_no_opt_in():
    assert function_of(object(), None) is None
    allow_smem(None, 10 * DEFAULT_SMEM_LIMIT)  # nothing to set
    allow_smem(object(), 0)  # no dynamic shared memory: no driver call


def test_the_narrow_entry_point_needs_a_source_to_compile_from():
    plan = build_file(EXAMPLES / "gemm.kg", "sm_90a").plan
    with pytest.raises(KgenRuntimeError, match="gemm_bf16_narrow, which its module lacks"):
        compile_narrow(plan, None, 0, {})
