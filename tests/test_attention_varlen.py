"""kgen.attention_varlen on the CPU: its backward with the forward's mods (score_mod
differentiated by kgen, mask_mod, scalars; `row`, `col`, `S`, `T` the sequence's own) written,
verified and evaluated by the NumPy reference against float64 autograd of a reference attention
computed document by document; NVRTC builds of the forward and backward with mods against the
dense programs' spills; and its torch ops (torch.ops.kgen.attention_varlen_fwd / _bwd): their
schemas, fake implementations (FakeTensorMode, torch.library.opcheck on meta tensors) and a
torch.compile(fullgraph=True) trace of forward and backward. The GPU runs are
tests/gpu/test_attention_varlen_mods_gpu.py."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kgen import attention_varlen as av
from kgen.attention_grad import BackwardSignature
from kgen.attention_grad_mods import Mods
from kgen.errors import ArgumentError, KgenError
from tests.attention_mods_cases import CASES, Case, reference_attention
from tests.test_backward_varlen import kernels

torch = pytest.importorskip("torch")


def varlen_cases(window: float) -> list[Case]:
    """The mods kgen.attention_varlen's backward takes, as tests/attention_mods_cases.py's
    cases (scalars, and vectors read at head: ALiBi's slopes[head]; no attn_mask)."""
    softcap, alibi = (next(c for c in CASES if c.name == n) for n in ("softcap", "alibi"))
    return [
        softcap,
        dataclasses.replace(alibi, name="alibi_heads", options={
            "score_mod": alibi.options["score_mod"]}),
        Case("alibi_scalar", {"score_mod": "score + slope * (col - row)",
                              "scalars": {"slope": 0.25}},
             score=lambda torch, s, r, c, v, k: s + k["slope"] * (c - r)),
        Case("window", {"mask_mod": "row - col < window", "scalars": {"window": window}},
             mask=lambda r, c, v, k: r - c < k["window"]),
    ]


def with_causal(case: Case, causal: bool) -> Case:
    return dataclasses.replace(case, options=dict(case.options, is_causal=causal))


def per_document(torch, case: Case, q, k, v, cu_q, cu_k, scale: float, vectors=None):
    """O [total_q, H, D] and lse [H, total_q] of packed q, k, v [total, H, D] (float64,
    differentiable), tests/attention_mods_cases.py's reference_attention run document by
    document (the offsets as lists; a document's queries and keys of one length, so the
    reference's top-left causal is varlen's bottom-right)."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o, lse = reference_attention(torch, case, *(x[r].transpose(0, 1)[None] for x, r in
                                                   ((q, sq), (k, sk), (v, sk))),
                                     None, vectors or {}, scale)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def mods_of(case: Case) -> Mods:
    o = case.options
    vectors = (("slopes", "head"),) if case.vectors else ()  # the one vector varlen's cases read
    return Mods(o.get("score_mod"), o.get("mask_mod"), tuple(sorted(o.get("scalars", {}))),
                vectors)


# ---------------------------------------------------------------------------------------------
# The backward's program with mods


def test_the_backward_text_differentiates_and_masks_per_sequence():
    sig = BackwardSignature("bf16", 128, True, "sm_90a", mods=Mods(
        "cap * tanh(score / cap)", "row - col < 256", ("cap",)))
    text = av.backward_text(sig)
    name = av.backward_name(sig)
    main = text[text.index(f"kernel {name}_main"):text.index(f"kernel {name}_dq")]
    assert "  packed T by cu_seqlens_k\n  packed S by cu_seqlens_q\n  loop q over S {" in main
    assert "  scalar cap : f32 = 0\n" in main
    assert "modded = cap * tanh((score / cap))" in main  # transposed: the forward's own
    # the forward's bottom-right causal term and the window, in the backward's orientation
    mask = "(row <= ((col + T) - S)) * ((col - row) < 256.0)"
    assert f"pt = where({mask}, exp(modded - lse[col]), 0)" in main
    assert f"dst = where({mask}, pt * (acc - D[col]) * (1.0 - " in main  # kgen's derivative
    # one program per mod; the plain backward keeps its name
    assert name != av.backward_name(dataclasses.replace(sig, mods=Mods()))
    plain = BackwardSignature("bf16", 128, True, "sm_90a")
    assert av.backward_name(plain) == plain.name.replace("attention_bwd_",
                                                         "attention_varlen_bwd_")


def test_alibi_s_derivative_is_one():
    sig = BackwardSignature("f16", 64, False, "sm_80", mods=Mods(
        "score + slope * (col - row)", None, ("slope",)))
    main = av.backward_text(sig)
    assert "modded = score + (slope * (row - col))" in main  # row and col swapped
    assert "dst = pt * (acc - D[col])\n" in main
    assert av.backward_module(sig).kernels  # verifies


def test_a_mistake_in_a_causal_mask_mod_is_located_in_the_mod():
    sig = BackwardSignature("bf16", 64, True, "sm_80", mods=Mods(None, "row - nope < 3", ()))
    with pytest.raises(KgenError) as info:
        av.backward_text(sig)
    assert info.value.loc.file == "mask_mod" and info.value.loc.col == 7


@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", varlen_cases(7.0), ids=lambda c: c.name)
def test_the_packed_backward_with_mods_evaluates_to_float64_autograd(case, causal, heads,
                                                                     kv_heads):
    """The three programs (dot, main, dq) by the NumPy reference over documents of 1, 17, 40
    and 33 tokens against float64 autograd document by document; with GQA 4:2 too."""
    import ml_dtypes

    from kgen.reference import evaluate

    case = with_causal(case, causal)
    lengths, d = (1, 17, 40, 33), 32
    cu = [0, *np.cumsum(lengths).tolist()]
    gen = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.randn(cu[-1], n, d, generator=gen).bfloat16().double()
                   for n in (heads, kv_heads, kv_heads, heads))
    scale = 1 / math.sqrt(d)
    vectors = case.vectors(torch, gen, 1, heads, 0, 0) if case.vectors else {}
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = per_document(torch, case, *leaves, cu, cu, scale, vectors)
    out.backward(do)

    def packed(x):  # [total, H, D] as the programs take it: [H, total, D]
        return x.detach().transpose(0, 1).numpy().astype(ml_dtypes.bfloat16)

    ks = kernels(BackwardSignature("bf16", d, causal, "sm_80", gqa=heads != kv_heads,
                                   mods=mods_of(case)))
    offsets = np.array(cu, np.int32)
    inputs = dict(Q=packed(q), K=packed(k), V=packed(v), dO=packed(do), cu_seqlens_q=offsets,
                  cu_seqlens_k=offsets)
    dot = evaluate(ks["dot"], {"dO": inputs["dO"][None], "O": packed(out)[None]}, {})["D"][0]
    scalars = dict(case.options.get("scalars", {}), scale=scale)
    got = evaluate(ks["main"], dict(inputs, lse=lse.detach().numpy().astype(np.float32),
                                    D=dot, **{n: t.numpy().astype(np.float32)
                                              for n, t in vectors.items()}), scalars, block=16)
    dq = evaluate(ks["dq"], {"dQacc": got["dQacc"][None].astype(np.float32)}, {})["dQ"][0]
    for name, have, leaf in (("dQ", dq, leaves[0]), ("dK", got["dK"], leaves[1]),
                             ("dV", got["dV"], leaves[2])):
        have = np.asarray(have, np.float64)
        want = leaf.grad.transpose(0, 1).numpy()
        assert have.shape == want.shape and np.isfinite(have).all(), name
        err = np.abs(have - want).max()
        assert err <= 0.02 * max(1.0, np.abs(want).max()), (name, err)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_packed_forward_with_head_vectors_evaluates_to_float64(causal):
    """kgen.attention_varlen's program with ALiBi's slopes[head] (GQA 4:2) by the NumPy
    reference: O and lse against float64 document by document."""
    from kgen import attention as dense
    from kgen.reference import evaluate

    case = with_causal(next(c for c in varlen_cases(7.0) if c.name == "alibi_heads"), causal)
    lengths, d = (1, 17, 40, 33), 32
    cu = [0, *np.cumsum(lengths).tolist()]
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(cu[-1], n, d, generator=gen).double() for n in (4, 2, 2))
    vectors = case.vectors(torch, gen, 1, 4, 0, 0)
    m = mods_of(case)
    sig = dense.Signature("f16", d, d, causal, m.score_mod, None, (), "sm_80",
                          vectors=m.vectors)
    offsets = np.array(cu, np.int32)
    got = evaluate(av.program(sig), dict(
        Q=q.transpose(0, 1).numpy(), K=k.transpose(0, 1).numpy(), V=v.transpose(0, 1).numpy(),
        cu_seqlens_q=offsets, cu_seqlens_k=offsets, slopes=vectors["slopes"].numpy()),
        {"scale": 1 / math.sqrt(d)}, block=16)
    want, want_lse = per_document(torch, case, q, k, v, cu, cu, 1 / math.sqrt(d), vectors)
    np.testing.assert_allclose(got["O"], want.transpose(0, 1).numpy(), atol=1e-3)
    np.testing.assert_allclose(got["lse"], want_lse.numpy(), atol=1e-3)


def _spill_stores(kernel, arch: str) -> int:
    """NVRTC's spill stores (bytes) of `kernel` built for `arch`."""
    from kgen.api import build_verified
    from kgen.runtime.nvrtc import compile_cubin

    built = build_verified(kernel, arch)
    return compile_cubin(built.source, built.plan.name, arch).resources().get("spill_stores", 0)


def _check_backward_spills(sig, over: dict, ceiling: int, name: str) -> dict:
    """The packed backward's main kernel spills no more than the dense one's: nothing where
    that has none (but the measured `over` by (arch, case name, causal)), at most `ceiling`
    bytes where it spills. The packed kernels, by role."""
    from kgen.attention_grad import backward_module

    packed = kernels(sig)
    main = next(k for k in backward_module(sig).kernels if k.name.endswith("_main"))
    dense_spills, packed_spills = (_spill_stores(k, sig.arch) for k in (main, packed["main"]))
    if dense_spills == 0:
        assert packed_spills <= over.get((sig.arch, name, sig.causal), 0)
    else:
        assert packed_spills <= ceiling
    return packed


# the builds' spill stores (bytes) measured above the dense program's 0 (NVRTC 13.5, bf16, D 128):
# the causal window's two bounds over packed sequences on sm_90a
SPILLS_OVER_DENSE = {("sm_90a", "window", True): 4}
# the packed forward's, over the dense forward's 0: ALiBi's slopes[head] under the causal mask
PACKED_FORWARD_SPILLS = {("sm_90a", "alibi_heads", True): 4}
# where the dense backward spills (softcap: sm_90a 200 B, sm_80 8 B), the packed one's ceiling
# (measured sm_90a 220 B, sm_80 108 B)
SPILL_CEILING = 256


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", varlen_cases(256.0), ids=lambda c: c.name)
def test_nvrtc_builds_with_mods_spill_as_the_dense_programs(case, causal, arch):
    """The forward and the backward's main kernel with the mods, packed and dense, compiled by
    NVRTC: no spill where the dense one has none (PACKED_FORWARD_SPILLS and SPILLS_OVER_DENSE:
    the measured exceptions)."""
    from kgen import attention as dense

    m = mods_of(case)
    fsig = dense.Signature("bf16", 128, 128, causal, m.score_mod, m.mask_mod, m.scalars, arch,
                           vectors=m.vectors)
    assert _spill_stores(dense.program(fsig), arch) == 0
    assert _spill_stores(av.program(fsig), arch) <= PACKED_FORWARD_SPILLS.get(
        (arch, case.name, causal), 0)
    packed = _check_backward_spills(BackwardSignature("bf16", 128, causal, arch, mods=m),
                                    SPILLS_OVER_DENSE, SPILL_CEILING, case.name)
    assert _spill_stores(packed["dot"], arch) == _spill_stores(packed["dq"], arch) == 0


# with GQA (K and V of HKV heads), the packed backward's spill stores over the dense one's 0
# (NVRTC 13.5, bf16, D 128): the window on sm_90a; and where the dense one spills (softcap:
# sm_90a 96 / 228 bytes full / causal, sm_80 8), the packed one's ceiling (measured 88 / 260
# and 8 / 120)
GQA_SPILLS_OVER_DENSE = {("sm_90a", "window", False): 8, ("sm_90a", "window", True): 36}
GQA_SPILL_CEILING = 288


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", varlen_cases(256.0), ids=lambda c: c.name)
def test_nvrtc_builds_the_packed_backward_with_mods_and_gqa(case, causal, arch):
    """The backward's main kernel with a mod and GQA, packed and dense, compiled by NVRTC."""
    _check_backward_spills(BackwardSignature("bf16", 128, causal, arch, gqa=True,
                                             mods=mods_of(case)),
                           GQA_SPILLS_OVER_DENSE, GQA_SPILL_CEILING, case.name)


# ---------------------------------------------------------------------------------------------
# The torch ops


def _meta(total_q=100, total_k=60, heads=4, kv_heads=4, d=64, d_v=64, device="meta"):
    q = torch.empty(total_q, heads, d, dtype=torch.bfloat16, device=device)
    k = torch.empty(total_k, kv_heads, d, dtype=torch.bfloat16, device=device)
    v = torch.empty(total_k, kv_heads, d_v, dtype=torch.bfloat16, device=device)
    cu_q, cu_k = (torch.empty(3, dtype=torch.int32, device=device) for _ in range(2))
    return q, k, v, cu_q, cu_k


SOFTCAP = dict(score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0})
ALIBI = "score - slopes[head] * (row - col)"


def test_the_ops_schemas():
    fwd, bwd = torch.ops.kgen.attention_varlen_fwd, torch.ops.kgen.attention_varlen_bwd
    assert str(fwd.default._schema) == "kgen::attention_varlen_fwd" + av.FORWARD_SCHEMA
    assert str(bwd.default._schema) == "kgen::attention_varlen_bwd" + av.BACKWARD_SCHEMA
    for op, registered in zip(av._ops(), (fwd, bwd)):
        assert op.op is registered
        # the implementation's parameters, by which the eager call names the arguments
        assert op._names == tuple(a.name for a in registered.default._schema.arguments)


@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_opcheck_on_meta_tensors(op):
    """torch.library.opcheck: the schema, the fake implementation under dynamic shapes
    (aot_dispatch_dynamic) and no autograd registration on the op itself (the Function's)."""
    q, k, v, cu_q, cu_k = _meta(kv_heads=2)
    options = (64, 64, 0.125, True, ALIBI, "row - col < 256", ["cap"], [30.0], "sm_90a",
               ["slopes"], [torch.empty(4, device="meta")])
    if op == "fwd":
        args = (q, k, v, cu_q, cu_k, *options)
    else:
        out, lse = torch.ops.kgen.attention_varlen_fwd(q, k, v, cu_q, cu_k, *options)
        args = (out, q, k, v, out, lse, cu_q, cu_k, *options, False)
    result = torch.library.opcheck(getattr(torch.ops.kgen, f"attention_varlen_{op}"), args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_fake_tensors_give_the_outputs_layouts():
    """FakeTensorMode (no GPU): on CUDA tensors O [total_q, H, D_v] contiguous and lse [H,
    total_q] f32; through autograd (meta tensors: the engine wants no CUDA stream) dQ, dK, dV
    of q's, k's and v's shapes, contiguous."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v, cu_q, cu_k = _meta(kv_heads=2, d_v=32, device="cuda")
        out, lse = av.attention_varlen(q, k, v, cu_q, cu_k, 70, 40, is_causal=True,
                                       return_lse=True, arch="sm_90a", **SOFTCAP)
        assert out.shape == (100, 4, 32) and out.is_contiguous() and out.dtype == q.dtype
        assert lse.shape == (4, 100) and lse.dtype == torch.float32 and lse.is_contiguous()
        q, k, v, cu_q, cu_k = _meta(kv_heads=4)
        leaves = [x.requires_grad_() for x in (q, k, v)]
        out = av.attention_varlen(*leaves, cu_q, cu_q, 70, 70, is_causal=True, arch="sm_90a",
                                  mask_mod="row - col < 256")
        assert type(out.grad_fn).__name__ == "VarlenFunctionBackward"
        out.sum().backward()
        for leaf in leaves:
            assert leaf.grad.shape == leaf.shape and leaf.grad.is_contiguous()


@pytest.mark.parametrize("call", ["function", "module"])
@pytest.mark.parametrize("same_offsets", [False, True], ids=["two-offsets", "one-offsets"])
def test_torch_compile_traces_forward_and_backward_in_one_graph(same_offsets, call):
    """torch.compile(fullgraph=True) of a training step (meta tensors: the ops' fake
    implementations run, no kernel): no graph break, the forward graph calls the forward op and
    the backward graph the backward op; called as the function or as `kgen.attention_varlen`
    (the callable namespace, kgen/callable_module.py)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    import kgen

    attention_varlen = (kgen.attention_varlen.attention_varlen if call == "function" else
                        kgen.attention_varlen)

    graphs = []

    def record(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    def step(q, k, v, cu_q, cu_k):
        out = attention_varlen(q, k, v, cu_q, cu_k, 70, 70, is_causal=True, arch="sm_90a",
                               **SOFTCAP)
        return out.float().square().sum()

    q, k, v, cu_q, cu_k = _meta()
    cu_k = cu_q if same_offsets else cu_k
    leaves = [x.requires_grad_() for x in (q, k, v)]
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True,
                             backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    compiled(*leaves, cu_q, cu_k).backward()
    assert len(graphs) == 2
    assert "kgen.attention_varlen_fwd.default" in graphs[0]
    assert "kgen.attention_varlen_bwd.default" in graphs[1]
    assert all(leaf.grad.shape == leaf.shape for leaf in leaves)


@pytest.mark.parametrize("change, message", [
    (dict(mods=dict(score_mod="score * dK", scalars={"dK": 2.0})), "'dK' is a name of"),
    (dict(mods=dict(score_mod="score * D[head]", vectors={"D": torch.ones(4)})),
     "'D' is a name of"),
])
def test_the_backward_refuses_what_it_does_not_take(change, message):
    q, k, v, cu_q, cu_k = _meta(kv_heads=change.get("kv_heads", 4), d_v=change.get("d_v", 64))
    q.requires_grad_()
    with pytest.raises(ArgumentError, match=message):
        av.attention_varlen(q, k, v, cu_q, cu_k, 70, 70, arch="sm_90a",
                            **change.get("mods", {}))


@pytest.mark.parametrize("mods, message", [
    (dict(mask_mod="qd[row] == 1", vectors={"qd": torch.ones(100)}),
     "takes vectors read at head .* 'qd' is read at row: not yet"),
    (dict(score_mod=ALIBI, vectors={"slopes": torch.ones(3)}),
     r"vector 'slopes' is read at head: it must be \[H\] = \[4\], got \[3\]"),
    (dict(score_mod="score", vectors={"slopes": torch.ones(4)}),
     "vector 'slopes' is not read by score_mod or mask_mod"),
], ids=["row", "shape", "unread"])
def test_a_call_takes_vectors_read_at_head_only(mods, message):
    with pytest.raises(ArgumentError, match=message):
        av.attention_varlen(*_meta(), 70, 70, arch="sm_90a", **mods)


@pytest.fixture
def cpu_stand_ins():
    """CPU implementations of the two ops standing in for the kernels (for this test only): the
    forward's O all 1, the backward's dQ, dK, dV all 2, 3, 4; each call's options recorded."""
    calls = []

    def forward(q, k, v, cu_q, cu_k, *options):
        *options, vectors = options  # the vectors by their shapes
        calls.append(("fwd", *options, [tuple(t.shape) for t in vectors]))
        return (q.new_full((q.shape[0], q.shape[1], v.shape[-1]), 1.0),
                q.new_zeros((q.shape[1], q.shape[0]), dtype=torch.float32))

    def backward(do, q, k, v, out, lse, cu_q, cu_k, *options):
        *options, vectors, deterministic = options
        calls.append(("bwd", *options, [tuple(t.shape) for t in vectors], deterministic))
        return q.new_full(q.shape, 2.0), k.new_full(k.shape, 3.0), v.new_full(v.shape, 4.0)

    library = torch.library.Library("kgen", "IMPL")
    library.impl("attention_varlen_fwd", forward, "CPU")
    library.impl("attention_varlen_bwd", backward, "CPU")
    yield calls
    del library  # its registrations go with it


def test_inductor_compiles_a_training_step_to_the_two_ops(cpu_stand_ins):
    """torch.compile(fullgraph=True) with the default backend (inductor) on CPU tensors, the
    ops' CPU stand-ins run: each call's options reach the ops as given, a second batch of other
    lengths recompiles, the gradients are the backward op's."""
    from kgen.attention_varlen import attention_varlen

    def step(q, k, v, cu, longest):
        return attention_varlen(q, k, v, cu, cu, longest, longest, is_causal=True,
                                mask_mod="row - col < 256", deterministic=True, arch="sm_90a",
                                **SOFTCAP)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    for total, longest in ((100, 40), (130, 70)):
        leaves = [torch.randn(total, 4, 64, dtype=torch.bfloat16).requires_grad_()
                  for _ in range(3)]
        cu = torch.tensor([0, 30, total], dtype=torch.int32)
        out = compiled(*leaves, cu, longest)
        out.float().sum().backward()
        assert out.shape == (total, 4, 64) and bool((out == 1).all())
        for leaf, value in zip(leaves, (2, 3, 4)):
            assert bool((leaf.grad == value).all())
        options = (longest, longest, 0.125, True, SOFTCAP["score_mod"], "row - col < 256",
                   ["cap"], [30.0], "sm_90a", [], [])
        assert cpu_stand_ins[-2:] == [("fwd", *options), ("bwd", *options, True)]


def test_inductor_hands_the_head_vectors_to_both_ops(cpu_stand_ins):
    """ALiBi's slopes[head] (FlashAttention's alibi_slopes) through torch.compile: the vector
    reaches the forward op and the backward op, and gets no gradient."""
    from kgen.attention_varlen import attention_varlen

    def step(q, k, v, cu, slopes):
        return attention_varlen(q, k, v, cu, cu, 40, 40, score_mod=ALIBI, arch="sm_90a",
                                vectors={"slopes": slopes}, deterministic=False)

    torch._dynamo.reset()
    leaves = [torch.randn(100, 4, 64, dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
    slopes = torch.rand(4)
    out = torch.compile(step, fullgraph=True)(*leaves, torch.tensor([0, 30, 100],
                                                                    dtype=torch.int32), slopes)
    out.float().sum().backward()
    options = (40, 40, 0.125, False, ALIBI, None, [], [], "sm_90a", ["slopes"], [(4,)])
    assert cpu_stand_ins[-2:] == [("fwd", *options), ("bwd", *options, False)]
    assert slopes.grad is None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_deterministic_semaphores_lie_at_the_longest_sequences_stride(arch):
    """The workspace holds (batch, head) x the longest sequence's blocks of semaphores; a
    sequence's lie at that stride, not at its own number of blocks (which made a long
    sequence's overlap the next one's: tests/gpu/test_attention_varlen_bwd_gpu.py)."""
    from kgen.api import build_verified

    sig = BackwardSignature("bf16", 128, True, arch, deterministic=True)
    source = build_verified(kernels(sig)["main"], arch).source
    assert "const int order_blocks = (p.loop_len + kBlock - 1) / kBlock;" in source
    assert "head) * order_blocks + block" in source
    assert "head) * blocks + block" not in source
