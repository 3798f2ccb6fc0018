"""kgen.attention under torch.compile, on the CPU (kgen/attention.py's `_traced` route): the
forward op's schema, its fake implementation (torch.library.opcheck on meta tensors), a fullgraph
trace to one op call, the eager call's checks, and the options that break the graph. The
backward's are tests/test_attention_grad_compile.py's."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kgen  # noqa: E402
from kgen import attention as kattention  # noqa: E402
from kgen.errors import ArgumentError  # noqa: E402


def _meta(heads=4, kv_heads=4, d=64, d_v=64, s=100, t=60):
    q = torch.empty(2, heads, s, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, kv_heads, t, d, dtype=torch.bfloat16, device="meta")
    v = torch.empty(2, kv_heads, t, d_v, dtype=torch.bfloat16, device="meta")
    return q, k, v


SOFTCAP = dict(score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0})


def test_the_forward_ops_schema():
    op = torch.ops.kgen.attention_fwd
    assert str(op.default._schema) == "kgen::attention_fwd" + kattention.FORWARD_SCHEMA
    assert kattention._DEFINED[0].op is op
    # the implementation's parameters, by which the eager call names the arguments
    assert kattention._DEFINED[0]._names == tuple(
        a.name for a in op.default._schema.arguments)


def test_opcheck_the_forward_op_on_meta_tensors():
    """torch.library.opcheck: the schema, the fake implementation (also under dynamic
    shapes) and no autograd registration on the op itself (the Function's)."""
    options = (0.125, True, SOFTCAP["score_mod"], "row - col < 256", ["cap"], [30.0])
    result = torch.library.opcheck(torch.ops.kgen.attention_fwd,
                                   (*_meta(kv_heads=2, d_v=32), *options))
    assert set(result.values()) == {"SUCCESS"}, result


def _recorded(graphs):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, example_inputs):
        graphs.append([n for n in gm.graph.nodes if n.op == "call_function"])
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record)


def test_torch_compile_traces_the_forward_to_one_op():
    """torch.compile(fullgraph=True) of `kgen.attention(...)` as users write it (meta tensors:
    the fake implementation runs, no kernel): one graph, one op call with the options as given;
    O [B, H, S, D_v] and lse [B, H, S] f32."""
    def call(q, k, v):
        return kgen.attention(q, k, v, is_causal=True, scale=0.5, enable_gqa=True,
                              score_mod=SOFTCAP["score_mod"], mask_mod="row - col < window",
                              scalars={"window": 16.0, "cap": 30.0}, return_lse=True)

    graphs = []
    torch._dynamo.reset()
    out, lse = torch.compile(call, fullgraph=True, backend=_recorded(graphs))(
        *_meta(kv_heads=2, d_v=32))
    assert out.shape == (2, 4, 100, 32) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 100) and lse.dtype == torch.float32
    [nodes] = graphs
    ops = [n for n in nodes if str(n.target) == "kgen.attention_fwd.default"]
    assert len(ops) == 1
    assert tuple(ops[0].args[3:]) == (0.5, True, SOFTCAP["score_mod"], "row - col < window",
                                      ["cap", "window"], [30.0, 16.0])


def test_torch_compile_checks_the_arguments_as_the_eager_call(monkeypatch):
    """A traced call's mistake is the eager call's ArgumentError (dynamo, finding it, runs the
    call eagerly, where the same check raises it)."""
    monkeypatch.setattr(kattention, "_arch", lambda device: "sm_80")  # no GPU to ask
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: kgen.attention(q, k, v), backend="eager")
    with pytest.raises(ArgumentError, match="pass enable_gqa=True"):
        compiled(*_meta(kv_heads=2))
    with pytest.raises(ArgumentError, match="scalar name 'row' is not usable"):
        torch.compile(lambda q, k, v: kgen.attention(q, k, v, scalars={"row": 1.0}),
                      backend="eager")(*_meta())


@pytest.mark.parametrize("option", [
    dict(vectors={"w": None}), dict(dropout_p=0.1), dict(return_rng=True),
    dict(block_mask=object())], ids=["vectors", "dropout", "return_rng", "block_mask"])
def test_the_options_not_traced_break_the_graph(option):
    """The options outside TRACED run the call eagerly: fullgraph=True refuses the break."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: kgen.attention(q, k, v, **option),
                             fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match="kgen.attention traces only"):
        compiled(*_meta())
