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


class Recorder:
    """A loaded kernel's stand-in: its plan, and the calls it gets."""

    def __init__(self, plan):
        self.plan = plan
        self.calls = []

    def __call__(self, **args):
        self.calls.append(args)
        return "ran"


def _op(name):
    torch = pytest.importorskip("torch")
    from kgen.torch_library import torch_op

    kernel = Recorder(plan_of("gemm_bias_relu"))
    return torch, kernel, torch_op(kernel, name=name, namespace="kgen_cpu_test")


def test_an_eager_call_on_plain_tensors_runs_the_kernel_itself():
    torch, kernel, op = _op("eager")
    a, b, c, v = (torch.ones(4, 8), torch.ones(8, 6), torch.ones(4, 6), torch.ones(6))
    assert op(a, b, c, v, beta=0.25) == "ran"
    (args,) = kernel.calls
    assert list(args) == ["A", "B", "C", "bias", "beta"] and args["beta"] == 0.25
    assert op.op is torch.ops.kgen_cpu_test.eager


def test_tracing_and_autograd_see_the_registered_op():
    """Fake tensors (torch.compile's tracing), and tensors autograd records, go through the
    op: its fake implementation gives the outputs' shapes; the kernel is not called."""
    torch, kernel, op = _op("traced")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b, c, v = (torch.empty(4, 8), torch.empty(6, 8).t(), torch.empty(4, 6),
                      torch.empty(6))
        out = op(a, b, c, v)
    assert tuple(out.shape) == (4, 6) and out.dtype == torch.float16
    grad = torch.ones(4, 8, requires_grad=True)
    with pytest.raises(NotImplementedError):  # the op has no CPU kernel: it was dispatched
        op(grad, torch.ones(8, 6), torch.ones(4, 6), torch.ones(6))
    with pytest.raises(RuntimeError, match="at most 6"):  # too many: the op's own message
        op(*([torch.ones(1)] * 7))
    assert kernel.calls == []


# Tile programs: the same op, its outputs contiguous in the shapes the inputs set


def test_a_programs_schema_and_output_shapes():
    from kgen.runtime.program import output_shapes as program_shapes

    plan = plan_of("attention_fwd")
    assert op_schema(plan) == ("(Tensor Q, Tensor K, Tensor V, float scale=0.08838834764) -> "
                               "(Tensor, Tensor)")
    shapes = program_shapes(plan, {"Q": (2, 8, 100, 128), "K": (2, 1, 70, 128),
                                   "V": (2, 1, 70, 128)})
    assert shapes == {"O": (2, 8, 100, 128), "lse": (2, 8, 100)}
    assert op_schema(plan_of("attention_bwd_dot")) == "(Tensor dO, Tensor O) -> Tensor"
    assert program_shapes(plan_of("mlp_loop"), {"X": (33, 256), "W0": (256, 500),
                                                "W1": (500, 128), "b0": (500,)}) == {
        "Y": (33, 128)}


def test_a_program_op_runs_eagerly_and_traces_with_its_shapes():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kgen.torch_library import torch_op

    kernel = Recorder(plan_of("attention_fwd"))
    op = torch_op(kernel, name="attention_cpu", namespace="kgen_cpu_test")
    q, kv = torch.ones(1, 4, 10, 128), torch.ones(1, 2, 12, 128)
    assert op(q, kv, kv, scale=0.5) == "ran"
    assert list(kernel.calls[0]) == ["Q", "K", "V", "scale"]
    with FakeTensorMode():
        q, kv = (torch.empty(2, 4, 10, 128, dtype=torch.bfloat16),
                 torch.empty(2, 2, 12, 128, dtype=torch.bfloat16))
        o, lse = op(q, kv, kv)
    assert tuple(o.shape) == (2, 4, 10, 128) and o.dtype == torch.bfloat16 and o.is_contiguous()
    assert tuple(lse.shape) == (2, 4, 10) and lse.dtype == torch.float32
    assert len(kernel.calls) == 1
