"""kgen.attention under torch.compile, on the CPU (kgen/attention_traced.py): the two ops'
schemas and fake implementations (torch.library.opcheck on meta tensors), fullgraph traces of
calls and training steps to one op per direction with every traced option (attn_mask and its
gradient, vectors, a dropout with its rng), the eager call's checks, the options that break
the graph, and inductor's compiled step reaching the ops (CPU stand-ins for the kernels). The
GPU runs are tests/gpu/test_attention_gpu.py's and tests/gpu/test_attention_grad_gpu.py's."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kgen  # noqa: E402
from kgen import attention as kattention  # noqa: E402
from kgen import attention_traced as traced  # noqa: E402
from kgen.errors import ArgumentError  # noqa: E402

SOFTCAP = dict(score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0})
ALIBI = dict(score_mod="score - slopes[head] * (row - col)")
# the ops' options after the tensors without mods: scale, causal, the mods' texts, scalars,
# vectors, dropout
PLAIN = (0.125, False, None, None, [], [], [], 0.0, [])


def _meta(heads=4, kv_heads=4, d=64, d_v=64, s=96, t=64, device="meta"):
    return (torch.empty(2, heads, s, d, dtype=torch.bfloat16, device=device),
            torch.empty(2, kv_heads, t, d, dtype=torch.bfloat16, device=device),
            torch.empty(2, kv_heads, t, d_v, dtype=torch.bfloat16, device=device))


def _recorded(graphs):
    """A torch.compile backend recording each graph's call_function nodes (aot_autograd: the
    forward and the backward graph apart)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, example_inputs):
        graphs.append([n for n in gm.graph.nodes if n.op == "call_function"])
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record)


def _op_calls(nodes, name):
    return [n for n in nodes if str(n.target) == f"kgen.{name}.default"]


@pytest.mark.parametrize("name, schema, op", [
    ("attention_fwd", traced.FORWARD_SCHEMA, traced._FORWARD),
    ("attention_bwd", traced.BACKWARD_SCHEMA, traced._BACKWARD)])
def test_the_ops_schemas(name, schema, op):
    found = getattr(torch.ops.kgen, name)
    assert str(found.default._schema) == f"kgen::{name}" + schema
    assert op.op is found
    # the implementation's parameters, by which the eager call names the arguments
    assert op._names == tuple(a.name for a in found.default._schema.arguments)


@pytest.mark.parametrize("bias, bias_grad", [(None, False), ((2, 1, 96, 64), False),
                                             ((4, 1, 64), True)], ids=["none", "bias", "grad"])
def test_opcheck_the_ops_on_meta_tensors(bias, bias_grad):
    """torch.library.opcheck: the schemas, the fake implementations (also under dynamic shapes)
    and no autograd registration on the ops themselves (the Function's)."""
    q, k, v = _meta(kv_heads=2)
    mask = None if bias is None else torch.empty(bias, dtype=torch.bfloat16, device="meta")
    vectors = [torch.empty(4, device="meta")]
    options = (0.125, True, ALIBI["score_mod"], "row - col < 256", [], [], ["slopes"], 0.1,
               [7, -3])
    out, lse = torch.ops.kgen.attention_fwd(q, k, v, mask, vectors, *options, [], [])
    assert out.shape == (2, 4, 96, 64) and lse.shape == (2, 4, 96)
    for op, args in ((torch.ops.kgen.attention_fwd, (q, k, v, mask, vectors, *options, [], [])),
                     (torch.ops.kgen.attention_bwd, (out, q, k, v, out, lse, mask, vectors,
                                                     *options, [], [], bias_grad, True))):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
    *_, dbias = torch.ops.kgen.attention_bwd(out, q, k, v, out, lse, mask, vectors, *options,
                                             [], [], bias_grad, False)
    assert dbias.shape == (bias if bias_grad else (0,))


def test_torch_compile_traces_a_call_to_one_op_with_every_traced_option():
    """torch.compile(fullgraph=True) of `kgen.attention(...)` as users write it (meta tensors:
    the fake implementation runs, no kernel): one graph, one op call with the options as given
    (scalars and vectors sorted by name, the dropout's rng as int64 bits); O [B, H, S, D_v] and
    lse [B, H, S] f32; return_rng gives the rng passed."""
    def call(q, k, v, bias, slopes, ids):
        return kgen.attention(q, k, v, bias, is_causal=True, scale=0.5, enable_gqa=True,
                              score_mod="score - slopes[head] * (row - col)",
                              mask_mod="(row - col < window) * (qd[row] == kd[col])",
                              scalars={"window": 16.0},
                              vectors={"slopes": slopes, "qd": ids, "kd": ids},
                              dropout_p=0.25, dropout_rng=(2**64 - 1, 12), return_lse=True,
                              return_rng=True)

    q, k, v = _meta(kv_heads=2, d_v=32, t=96)
    bias = torch.empty(96, 96, dtype=torch.bfloat16, device="meta")
    graphs = []
    torch._dynamo.reset()
    out, lse, rng = torch.compile(call, fullgraph=True, backend=_recorded(graphs))(
        q, k, v, bias, torch.empty(4, device="meta"), torch.empty(96, device="meta"))
    assert out.shape == (2, 4, 96, 32) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 96) and lse.dtype == torch.float32
    assert rng == (2**64 - 1, 12)
    [nodes] = graphs
    [op] = _op_calls(nodes, "attention_fwd")
    assert [a.meta["val"].shape for a in op.args[4]] == [(96,), (96,), (4,)]  # kd, qd, slopes
    assert tuple(op.args[5:]) == (
        0.5, True, "score - slopes[head] * (row - col)",
        "(row - col < window) * (qd[row] == kd[col])", ["window"], [16.0],
        ["kd", "qd", "slopes"], 0.25, [-1, 12], [], [])


def test_the_ops_options_give_back_the_calls_options():
    """What an op's implementation hands the eager call: the mods' dicts by name, the dropout's
    (seed, offset) from their int64 bits (none without a dropout)."""
    w, ids = object(), object()
    found = traced._call_options(None, [ids, w], None, "ids[row] == ids[col]", ["cap"], [3.0],
                                 ["ids", "w"], 0.5, [-1, 12])
    assert found == {"attn_mask": None, "score_mod": None, "mask_mod": "ids[row] == ids[col]",
                     "scalars": {"cap": 3.0}, "vectors": {"ids": ids, "w": w},
                     "dropout_p": 0.5, "dropout_rng": (2**64 - 1, 12)}
    assert "dropout_rng" not in traced._call_options(None, [], *PLAIN[2:])


def test_torch_compile_checks_the_arguments_as_the_eager_call(monkeypatch):
    """A traced call's mistake is the eager call's ArgumentError (dynamo, finding it, runs the
    call eagerly, where the same check raises it)."""
    monkeypatch.setattr(kattention, "_arch", lambda device: "sm_80")  # no GPU to ask
    for call, kv_heads, message in (
            (lambda q, k, v: kgen.attention(q, k, v), 2, "pass enable_gqa=True"),
            (lambda q, k, v: kgen.attention(q, k, v, scalars={"row": 1.0}), 4,
             "scalar name 'row' is not usable"),
            (lambda q, k, v: kgen.attention(q, k, v, vectors={"w": torch.empty(3)}, **ALIBI
                                            | {"score_mod": "score + w[head]"}), 4,
             r"vector 'w' is read at head: it must be \[H\] = \[4\], got \[3\]"),
            (lambda q, k, v: kgen.attention(q, k, v, torch.empty(3, 5, dtype=torch.bfloat16)),
             4, "does not broadcast"),
            (lambda q, k, v: kgen.attention(q, k, v, dropout_p=0.1, dropout_rng=(1, -2)), 4,
             "dropout_rng's offset must be an int")):
        torch._dynamo.reset()
        with pytest.raises(ArgumentError, match=message):
            torch.compile(call, backend="eager")(*_meta(kv_heads=kv_heads))


def _blocks(device="meta", full=True, rows=4, batch=1):
    """kgen's BlockLists of 128 x 128 blocks: [batch, 1, rows] counts, [..., 2] indices."""
    from kgen.attention_blocks import BlockLists

    lists = [torch.empty(shape, dtype=torch.int32, device=device) for shape in
             ((batch, 1, rows), (batch, 1, rows, 2)) * (2 if full else 1)]
    return BlockLists(*lists, block_size=(128, 128))


def test_torch_compile_traces_a_block_mask_to_the_forward_op():
    """A block mask (kgen's BlockLists, FlexAttention's BlockMask alike) is the forward op's
    block_lists and block_size: one op call, no break."""
    def call(q, k, v, block_mask):
        return kgen.attention(q, k, v, is_causal=True, block_mask=block_mask)

    graphs = []
    torch._dynamo.reset()
    for full in (True, False):
        out = torch.compile(call, fullgraph=True, backend=_recorded(graphs))(
            *_meta(s=400, t=256), _blocks(full=full))
        assert out.shape == (2, 4, 400, 64)
        [op] = _op_calls(graphs[-1], "attention_fwd")
        assert [a.meta["val"].shape for a in op.args[-2]] == [
            (1, 1, 4), (1, 1, 4, 2)] * (2 if full else 1)
        assert op.args[-1] == [128, 128]


def test_a_traced_block_mask_is_checked_as_the_eager_one(monkeypatch):
    """The block mask's mistakes under torch.compile are the eager call's: the lists' shapes,
    their rows for S, and what the backward does not take beside one (deterministic mode)."""
    monkeypatch.setattr(kattention, "_arch", lambda device: "sm_80")  # no GPU to ask
    for blocks, message in ((_blocks(rows=3), "lists 3 blocks of query rows; q's S needs 4"),
                            (_blocks(batch=3), "block_mask has batch 3, but q has 2")):
        torch._dynamo.reset()
        with pytest.raises(ArgumentError, match=message):
            torch.compile(lambda q, k, v, b: kgen.attention(q, k, v, block_mask=b),
                          backend="eager")(*_meta(s=400, t=256), blocks)
    q, k, v = _meta(s=400, t=256)
    q.requires_grad_()
    torch._dynamo.reset()
    with pytest.raises(ArgumentError, match="does not take block_mask in deterministic mode"):
        torch.compile(lambda q, k, v, b: kgen.attention(q, k, v, block_mask=b,
                                                        deterministic=True),
                      backend="eager")(q, k, v, _blocks())


def test_inductor_hands_a_block_mask_to_both_ops_of_a_training_step(cpu_stand_ins):
    """kgen's BlockLists in a compiled training step (inductor, CPU stand-ins): the forward op
    and the backward op get the same lists and BLOCK_SIZE (the backward's op transposes them
    at its tile), and the gradients are the backward op's."""
    from kgen.attention_blocks import from_dense

    mask = from_dense(torch.rand(1, 4, 256, 256) < 0.5, 128)
    leaves = _leaves(256)
    torch._dynamo.reset()
    out = torch.compile(lambda q, k, v, m: kgen.attention(q, k, v, block_mask=m),
                        fullgraph=True)(*leaves, mask)
    out.float().sum().backward()
    assert bool((leaves[0].grad == 2).all()) and bool((leaves[2].grad == 4).all())
    shapes = [(1, 4, 2), (1, 4, 2, 2)] * 2
    assert cpu_stand_ins[-3] == ("blocks", shapes, [128, 128])
    assert cpu_stand_ins[-1][0] == "bwd" and cpu_stand_ins[-1][-4:] == (shapes, [128, 128],
                                                                       False, False)


def test_inductor_hands_a_flex_block_mask_to_the_forward_op(cpu_stand_ins):
    """FlexAttention's BlockMask (create_block_mask on the CPU), compiled with inductor: the
    stand-in forward gets its four lists and BLOCK_SIZE."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 256, 256, device="cpu")
    q, k, v = _meta(s=256, t=256, device="cpu")
    torch._dynamo.reset()
    out = torch.compile(lambda q, k, v, m: kgen.attention(q, k, v, block_mask=m),
                        fullgraph=True)(q, k, v, mask)
    assert out.shape == (2, 4, 256, 64)
    blocks, fwd = cpu_stand_ins[-2:]
    assert blocks == ("blocks", [(1, 1, 2), (1, 1, 2, 2)] * 2, [128, 128])
    assert fwd[0] == "fwd"


def test_a_dropout_whose_rng_the_call_draws_breaks_the_graph():
    """A dropout without dropout_rng runs the call eagerly: fullgraph=True refuses the break,
    naming why."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: kgen.attention(q, k, v, dropout_p=0.1),
                             fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match="does not trace a dropout without"):
        compiled(*_meta())


@pytest.mark.parametrize("kv_heads, options, deterministic, d_v", [
    (4, dict(is_causal=True, **SOFTCAP), False, 64),
    (2, dict(enable_gqa=True, scale=0.25), True, 64),
    (4, dict(vectors={"slopes": torch.ones(4)}, dropout_p=0.1, dropout_rng=(5, 8), **ALIBI),
     False, 64),
    (2, dict(is_causal=True, enable_gqa=True), False, 32),
], ids=["causal-softcap", "gqa-deterministic", "alibi-dropout", "gqa-value-dim-32"])
def test_torch_compile_traces_a_training_step_in_one_graph(kv_heads, options, deterministic,
                                                           d_v):
    """torch.compile(fullgraph=True) of a training step calling `kgen.attention(...)` (meta
    tensors: the ops' fake implementations run, no kernel): the forward graph calls the forward
    op once, the backward graph the backward op once with the forward's tensors and options,
    bias_grad and `deterministic`; the gradients have q's, k's and v's shapes (v's head dim
    unlike q's too)."""
    vectors = {name: t.to("meta") for name, t in options.pop("vectors", {}).items()}

    def step(q, k, v):
        out, lse = kgen.attention(q, k, v, return_lse=True, deterministic=deterministic,
                                  vectors=vectors or None, **options)
        return out.float().square().sum() + lse.sum()

    graphs = []
    leaves = [x.requires_grad_() for x in _meta(kv_heads=kv_heads, d_v=d_v)]
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True, backend=_recorded(graphs))(*leaves).backward()
    assert len(graphs) == 2
    [fwd] = _op_calls(graphs[0], "attention_fwd")
    [bwd] = _op_calls(graphs[1], "attention_bwd")
    assert not _op_calls(graphs[0], "attention_bwd") and not _op_calls(graphs[1], "attention_fwd")
    assert len(bwd.args[7]) == len(fwd.args[4]) == len(vectors)
    assert fwd.args[-2:] == ([], [])  # no block mask
    assert tuple(bwd.args[8:]) == (*fwd.args[5:], False, deterministic)
    assert fwd.args[5:7] == (options.get("scale", 0.125), options.get("is_causal", False))
    for leaf in leaves:
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype


@pytest.fixture
def cpu_stand_ins():
    """CPU implementations of the two ops standing in for the kernels (for these tests only):
    the forward's O all 1, the backward's dQ, dK, dV all 2, 3, 4 and attn_mask's gradient 5 in
    its shape (bias_grad) or empty; each call's bias shape, vector shapes and options recorded."""
    calls = []

    def shapes(mask, vectors):
        return (None if mask is None else tuple(mask.shape), [tuple(t.shape) for t in vectors])

    def forward(q, k, v, mask, vectors, *options):
        *options, lists, size = options
        if lists:  # a block mask's lists: their shapes and BLOCK_SIZE, a call of their own
            calls.append(("blocks", [tuple(t.shape) for t in lists], size))
        calls.append(("fwd", *shapes(mask, vectors), *options))
        return (q.new_full((*q.shape[:3], v.shape[-1]), 1.0),
                q.new_zeros(q.shape[:3], dtype=torch.float32))

    def backward(do, q, k, v, out, lse, mask, vectors, *options):
        *options, lists, size, bias_grad, deterministic = options  # the lists by their shapes
        calls.append(("bwd", *shapes(mask, vectors), *options, [tuple(t.shape) for t in lists],
                      size, bias_grad, deterministic))
        dbias = mask.new_full(mask.shape, 5.0) if bias_grad else q.new_empty(0)
        return q.new_full(q.shape, 2.0), k.new_full(k.shape, 3.0), v.new_full(v.shape, 4.0), dbias

    library = torch.library.Library("kgen", "IMPL")
    library.impl("attention_fwd", forward, "CPU")
    library.impl("attention_bwd", backward, "CPU")
    yield calls
    del library  # its registrations go with it


def _leaves(length, *shapes):
    leaves = [x.requires_grad_() for x in _meta(s=length, t=length, device="cpu")]
    with torch.no_grad():
        for x in leaves:
            x.normal_()
    return leaves + [torch.randn(shape, dtype=torch.bfloat16) for shape in shapes]


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
            leaves = _leaves(length)
            out = compiled(*leaves)
            out.float().sum().backward()
            assert out.shape == (2, 4, length, 64) and bool((out == 1).all())
            for leaf, value in zip(leaves, (2, 3, 4)):
                assert bool((leaf.grad == value).all())
            options = (0.125, True, SOFTCAP["score_mod"], "row - col < 256", ["cap"], [30.0],
                       [], 0.0, [])
            assert cpu_stand_ins[-2:] == [("fwd", None, [], *options),
                                          ("bwd", None, [], *options, [], [], False, deterministic)]
    finally:
        torch.use_deterministic_algorithms(before)


def test_inductor_compiles_a_step_with_a_bias_its_gradient_and_vectors(cpu_stand_ins):
    """A bias that requires grad gets the backward op's gradient in its own shape (a bias the
    same for every row: [1, H, 1, T]); the vectors reach both ops (not differentiated); a bias
    that does not require grad asks for none (bias_grad False) and gets none."""
    def step(q, k, v, bias, slopes):
        return kgen.attention(q, k, v, bias, vectors={"slopes": slopes}, **ALIBI)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    q, k, v, bias = _leaves(48, (1, 4, 1, 48))
    slopes = torch.rand(4)
    bias.requires_grad_()
    compiled(q, k, v, bias, slopes).float().sum().backward()
    assert bias.grad.shape == bias.shape and bool((bias.grad == 5).all())
    assert slopes.grad is None
    options = (0.125, False, ALIBI["score_mod"], None, [], [], ["slopes"], 0.0, [])
    assert cpu_stand_ins[-2:] == [("fwd", (1, 4, 1, 48), [(4,)], *options),
                                  ("bwd", (1, 4, 1, 48), [(4,)], *options, [], [], True, False)]
    q, k, v, bias = _leaves(48, (48, 48))
    compiled(q, k, v, bias, slopes).float().sum().backward()
    assert bias.grad is None and cpu_stand_ins[-1][-2:] == (False, False)


def test_a_traced_training_call_checks_as_the_eager_one(monkeypatch):
    """What the backward does not take (attn_mask's gradient at a query length not a multiple
    of 8) is the eager call's ArgumentError."""
    monkeypatch.setattr(kattention, "_arch", lambda device: "sm_80")  # no GPU to ask
    q, k, v = _meta(s=20)
    bias = torch.empty(20, 64, dtype=torch.bfloat16, device="meta").requires_grad_()
    torch._dynamo.reset()
    with pytest.raises(ArgumentError, match="query length to be a multiple of 8"):
        torch.compile(lambda q, k, v, b: kgen.attention(q, k, v, b), backend="eager")(
            q, k, v, bias)


@pytest.mark.parametrize("first", ["kgen.attention_grad", "kgen.attention_traced",
                                   "kgen.attention_varlen", "kgen.attention"])
def test_each_attention_module_imports_first(first):
    """The ops register whichever attention module a fresh process imports first (the modules
    import one another)."""
    import subprocess
    import sys

    code = f"import {first}, torch; print(torch.ops.kgen.attention_bwd.default._schema.name)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip() == "kgen::attention_bwd"
