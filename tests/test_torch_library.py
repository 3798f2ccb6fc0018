"""The torch operator's schema and output shapes come from the plan alone (no torch, no GPU)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kgen.api import build_file
from kgen.errors import ArgumentError
from kgen.torch_library import infer_sizes, op_schema, output_shapes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def plan_of(name: str):
    return build_file(EXAMPLES / f"{name}.kg").plan


def test_schema_lists_inputs_in_order_with_scalar_defaults():
    assert op_schema(plan_of("gemm_bias_relu")) == (
        "(Tensor A, Tensor B, Tensor C, Tensor bias, float alpha=1.5, float beta=0.5) -> Tensor")


def test_schema_of_several_outputs_is_a_tuple():
    assert op_schema(plan_of("evt_multi_output")).endswith("-> (Tensor, Tensor)")
    assert op_schema(plan_of("evt_colsum")) == (
        "(Tensor A, Tensor B) -> (Tensor, Tensor, Tensor, Tensor)")


def test_output_shapes_from_the_inputs():
    plan = plan_of("evt_colsum")
    sizes = infer_sizes(plan, {"A": (300, 72), "B": (72, 130)})
    assert sizes == {"M": 300, "K": 72, "N": 130}
    assert output_shapes(plan, sizes) == {
        "G": ((300, 130), (130, 1)),
        "dbias": ((130,), (1,)),
        "gmax": ((130,), (1,)),
        "total": ((), ()),
    }


def test_fixed_sizes_need_no_input():
    plan = plan_of("b2b_gemm_rf")
    sizes = infer_sizes(plan, {p.name: (1000, p.shape[1]) if p.shape[0] == "M" else p.shape
                               for p in plan.params if not p.is_output})
    ((shape, strides),) = output_shapes(plan, sizes).values()
    assert shape[0] == 1000 and all(isinstance(d, int) for d in shape)


def test_an_output_size_no_input_has_is_refused():
    with pytest.raises(ArgumentError, match="appears in no argument"):
        output_shapes(plan_of("gemm_bias_relu"), {"M": 4})
