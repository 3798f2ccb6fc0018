"""kgen.attention that trains, under torch.compile, on the CPU (kgen/attention_grad.py's
backward op and the Function pairing it with kgen/attention.py's forward op): the schema, the
fake implementation (torch.library.opcheck on meta tensors), a fullgraph trace of a training
step (forward and backward op in one graph each, no break), and inductor's compiled step
reaching the ops with the call's options (CPU stand-ins for the kernels). The GPU runs are
tests/gpu/test_attention_grad_gpu.py's."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kgen  # noqa: E402
from kgen import attention as kattention  # noqa: E402
from kgen import attention_grad as kgrad  # noqa: E402
from kgen.errors import ArgumentError  # noqa: E402
from tests.test_attention_compile import _recorded  # noqa: E402  (the graph-recording backend)

SOFTCAP = dict(score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0})


def _meta(heads=4, kv_heads=4, d=64, s=100, t=60, device="meta"):
    return tuple(torch.empty(2, n, length, d, dtype=torch.bfloat16, device=device)
                 for n, length in ((heads, s), (kv_heads, t), (kv_heads, t)))


def test_the_backward_ops_schema():
    op = torch.ops.kgen.attention_bwd
    assert str(op.default._schema) == "kgen::attention_bwd" + kgrad.BACKWARD_SCHEMA
    assert kgrad._DEFINED[0].op is op
    assert kgrad._DEFINED[0]._names == tuple(a.name for a in op.default._schema.arguments)


def test_opcheck_the_backward_op_on_meta_tensors():
    q, k, v = _meta(kv_heads=2)
    options = (0.125, True, None, None, [], [])
    out, lse = torch.ops.kgen.attention_fwd(q, k, v, *options)
    result = torch.library.opcheck(torch.ops.kgen.attention_bwd,
                                   (out, q, k, v, out, lse, *options, True))
    assert set(result.values()) == {"SUCCESS"}, result




def _op_calls(nodes, name):
    return [n for n in nodes if str(n.target) == f"kgen.{name}.default"]


@pytest.mark.parametrize("kv_heads, options, deterministic", [
    (4, dict(is_causal=True, **SOFTCAP), False),
    (2, dict(enable_gqa=True, scale=0.25), True),
], ids=["causal-softcap", "gqa-deterministic"])
def test_torch_compile_traces_a_training_step_in_one_graph(kv_heads, options, deterministic):
    """torch.compile(fullgraph=True) of a training step calling `kgen.attention(...)` (meta
    tensors: the ops' fake implementations run, no kernel): the forward graph calls the forward
    op once, the backward graph the backward op once with the forward's options and
    `deterministic`; the gradients have q's, k's and v's shapes."""
    def step(q, k, v):
        out, lse = kgen.attention(q, k, v, return_lse=True, deterministic=deterministic,
                                  **options)
        return out.float().square().sum() + lse.sum()

    graphs = []
    leaves = [x.requires_grad_() for x in _meta(kv_heads=kv_heads)]
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True, backend=_recorded(graphs))(*leaves).backward()
    assert len(graphs) == 2
    [fwd] = _op_calls(graphs[0], "attention_fwd")
    [bwd] = _op_calls(graphs[1], "attention_bwd")
    assert not _op_calls(graphs[0], "attention_bwd") and not _op_calls(graphs[1], "attention_fwd")
    assert tuple(bwd.args[6:]) == (*fwd.args[3:], deterministic)
    assert fwd.args[3:5] == (options.get("scale", 0.125), options.get("is_causal", False))
    for leaf in leaves:
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype


@pytest.fixture
def cpu_stand_ins():
    """CPU implementations of the two ops standing in for the kernels (for this test only): the
    forward's O all 1, the backward's dQ, dK, dV all 2, 3, 4; each call's options recorded."""
    calls = []

    def forward(q, k, v, *options):
        calls.append(("fwd", *options))
        return (q.new_full((*q.shape[:3], v.shape[-1]), 1.0),
                q.new_zeros(q.shape[:3], dtype=torch.float32))

    def backward(do, q, k, v, out, lse, *options):
        calls.append(("bwd", *options))
        return q.new_full(q.shape, 2.0), k.new_full(k.shape, 3.0), v.new_full(v.shape, 4.0)

    library = torch.library.Library("kgen", "IMPL")
    library.impl("attention_fwd", forward, "CPU")
    library.impl("attention_bwd", backward, "CPU")
    yield calls
    del library  # its registrations go with it


def test_inductor_compiles_a_training_step_to_the_two_ops(cpu_stand_ins):
    """torch.compile(fullgraph=True) with the default backend (inductor) on CPU tensors, the
    ops' CPU stand-ins run: the call's options reach both ops, a second shape recompiles, the
    gradients are the backward op's; deterministic None follows torch's setting (a guard: the
    step recompiles when it changes)."""
    def step(q, k, v):
        return kgen.attention(q, k, v, is_causal=True, mask_mod="row - col < 256", **SOFTCAP)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        for length, deterministic in ((40, False), (72, True)):
            torch.use_deterministic_algorithms(deterministic)
            leaves = [x.requires_grad_() for x in _meta(s=length, device="cpu")]
            with torch.no_grad():
                for x in leaves:
                    x.normal_()
            out = compiled(*leaves)
            out.float().sum().backward()
            assert out.shape == (2, 4, length, 64) and bool((out == 1).all())
            for leaf, value in zip(leaves, (2, 3, 4)):
                assert bool((leaf.grad == value).all())
            options = (0.125, True, SOFTCAP["score_mod"], "row - col < 256", ["cap"], [30.0])
            assert cpu_stand_ins[-2:] == [("fwd", *options), ("bwd", *options, deterministic)]
    finally:
        torch.use_deterministic_algorithms(before)


def test_a_traced_training_call_checks_as_the_eager_one(monkeypatch):
    """What the backward does not take (a mod with GQA) is the eager call's ArgumentError."""
    monkeypatch.setattr(kattention, "_arch", lambda device: "sm_80")  # no GPU to ask
    q, k, v = _meta(kv_heads=2)
    q.requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: kgen.attention(q, k, v, enable_gqa=True,
                                                            **SOFTCAP), backend="eager")
    with pytest.raises(ArgumentError, match="does not take score_mod with GQA"):
        compiled(q, k, v)
