"""torch.autograd.gradcheck of the attention backward's semantics, on the CPU: the three kernels
kgen.attention's backward runs (kgen/attention_grad.py's `backward_text`: D = rowsum(dO * O),
the DAG loop, the dQ conversion) evaluated by kgen's NumPy reference (kgen/reference_tiles.py,
block by block as the kernels run) against finite differences of a float64 attention forward.

The reference evaluates a program in float64 and rounds where the program rounds: the values
handed to an accumulating gemm to its operand dtype, each output to its dtype. The programs are
written for f16 (the MMA operand dtypes kgen verifies) and evaluated with their f16 tensors
read as f32, so those roundings are f32's (relative 6e-8): far inside gradcheck's tolerances
(atol 1e-5, rtol 1e-3), which a wrong formula (a forgotten scale or D, a wrong mask) is far
outside of. tests/gpu/test_attention_gradcheck_gpu.py checks the kernels themselves."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kgen import ir
from kgen.attention_grad import BackwardSignature, backward_text
from kgen.parse import parse
from kgen.reference import evaluate
from kgen.verify import verify

torch = pytest.importorskip("torch")


def programs(d: int, causal: bool, text: str | None = None,
             d_v: int | None = None) -> dict[str, ir.Kernel]:
    """The backward's kernels by role (dot, main, dq), their f16 tensors read as f32."""
    sig = BackwardSignature("f16", d, causal, d_v=d_v)
    module = parse(text if text is not None else backward_text(sig), "bwd.kg")
    assert verify(module) == []

    def widened(k: ir.Kernel) -> ir.Kernel:
        return dataclasses.replace(k, params=tuple(
            dataclasses.replace(p, dtype=ir.DType.F32) if p.dtype is ir.DType.F16 else p
            for p in k.params))

    return {k.name.rsplit("_", 1)[1]: widened(k) for k in module.kernels}


def forward64(q, k, v, scale, causal):
    """float64 attention (top-left causal: query i sees keys j <= i): O and the LSE."""
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        keep = np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None]
        s = np.where(keep, s, -np.inf)
    top = s.max(-1, keepdims=True)
    lse = top + np.log(np.exp(s - top).sum(-1, keepdims=True))
    return np.exp(s - lse) @ v, lse[..., 0]


def attention_function(kernels: dict[str, ir.Kernel], scale: float, causal: bool):
    """An autograd.Function: the float64 forward, the backward by the reference of kernels."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = forward64(q.numpy(), k.numpy(), v.numpy(), scale, causal)
            ctx.save_for_backward(q, k, v, torch.from_numpy(o), torch.from_numpy(lse))
            return torch.from_numpy(o)

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = (t.numpy() for t in ctx.saved_tensors)
            do = do.numpy()
            dd = evaluate(kernels["dot"], {"dO": do, "O": o}, {})["D"]
            name = next(p.name for p in kernels["main"].params if p.accumulate)
            main = evaluate(kernels["main"], {"Q": q, "K": k, "V": v, "dO": do,
                                              "lse": lse.astype(np.float32), "D": dd},
                            {"scale": scale}, block=16)
            dq = evaluate(kernels["dq"], {name: main[name]}, {})["dQ"]
            return tuple(torch.from_numpy(x.astype(np.float64)) for x in
                         (dq, main["dK"], main["dV"]))

    return Attention.apply


def inputs(s, t, d, seed=0, d_v=None):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, width, generator=gen, dtype=torch.float64,
                             requires_grad=True) for n, width in ((s, d), (t, d), (t, d_v or d)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s, t", [(5, 7), (17, 3), (1, 20), (24, 20)])  # blocks of 16
def test_gradcheck_of_the_backward_programs(causal, s, t):
    d = 16
    scale = 1 / np.sqrt(d)
    f = attention_function(programs(d, causal), scale, causal)
    assert torch.autograd.gradcheck(f, inputs(s, t, d), eps=1e-6, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d, d_v", [(32, 16), (16, 32)])
def test_gradcheck_with_a_value_head_dim_unlike_the_query_s(causal, d, d_v):
    """D_v != D (BackwardSignature.d_v): dO, O, V and dV at D_v, dK's accumulator at D and dV's
    at D_v, each stored by its own statement after the loop."""
    scale = 1 / np.sqrt(d)
    f = attention_function(programs(d, causal, d_v=d_v), scale, causal)
    assert torch.autograd.gradcheck(f, inputs(17, 21, d, d_v=d_v), eps=1e-6, atol=1e-5,
                                    rtol=1e-3)


@pytest.mark.parametrize("old, new", [
    ("epilogue { dQacc += scale * acc }", "epilogue { dQacc += acc }"),  # the scale forgotten
    ("dst = pt * (acc - D[col])", "dst = pt * acc"),  # D forgotten
    ("dK = scale * dk", "dK = dk"),
    ("where(row <= col,", "where(row < col,"),  # the diagonal masked
])
def test_gradcheck_fails_a_wrong_program(old, new):
    """The check can fail: one formula of the backward broken, gradcheck rejects it."""
    d, causal = 16, True
    text = backward_text(BackwardSignature("f16", d, causal))
    assert old in text
    f = attention_function(programs(d, causal, text.replace(old, new)), 1 / np.sqrt(d), causal)
    assert not torch.autograd.gradcheck(f, inputs(9, 11, d), eps=1e-6, atol=1e-5, rtol=1e-3,
                                        raise_exception=False)
