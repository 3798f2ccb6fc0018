"""On a GPU: kgen.attention_varlen trains with the forward's mods (softcap, ALiBi with
slopes[head], an ALiBi-like score_mod of a scalar slope, a window mask_mod; causal and not) over
documents of 1, 17, 300 and 1000 tokens packed in one batch, with GQA 4:2 too: O, lse and dQ,
dK, dV against float64 autograd of the reference attention run document by document
(tests/test_attention_varlen.py per_document), every buffer kgen allocates poisoned with NaN;
both targets. Its torch ops: torch.compile(fullgraph=True) of forward and backward gives eager's
results bit for bit (deterministic mode), a training step captured in a CUDA graph replays on
new inputs and new offsets as eager computes them, and torch.library.opcheck compares the ops'
fake implementations with the kernels' outputs."""
from __future__ import annotations

import pytest

from kgen.attention_varlen import attention_varlen
from tests.gpu.attention_checks import close, close_grads, cuda_torch, skip_unless_runs
from tests.gpu.test_attention_varlen_bwd_gpu import poisoned  # noqa: F401 (the fixture)
from tests.test_attention_varlen import per_document, varlen_cases, with_causal

pytestmark = pytest.mark.gpu

LENGTHS = (1, 17, 300, 1000)
CASES = varlen_cases(256.0)  # the window: row - col < 256
SCALE = 0.1
# the training steps' mods: softcap and a window, causal
STEP = dict(score_mod="cap * tanh(score / cap)", mask_mod="row - col < 256",
            scalars={"cap": 30.0}, is_causal=True, deterministic=True)


def _arch(torch) -> str:
    return "sm_90a" if torch.cuda.get_device_capability() == (9, 0) else "sm_80"


def _inputs(torch, lengths, heads, d, seed, kv_heads=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q, k, v, do = (torch.randn(total, n, d, device="cuda", generator=gen).bfloat16()
                   for n in (heads, kv_heads or heads, kv_heads or heads, heads))
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    return q, k, v, do, cu


def _offsets(torch, cu):
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def _mods(case) -> dict:
    return {name: case.options[name] for name in ("score_mod", "mask_mod", "scalars")
            if name in case.options}


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_with_mods_against_float64_autograd(poisoned, case, causal, arch, kv_heads):
    torch = poisoned
    skip_unless_runs(arch)
    case = with_causal(case, causal)
    q, k, v, do, cu = _inputs(torch, LENGTHS, 4, 128, seed=3 + causal, kv_heads=kv_heads)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    offsets = _offsets(torch, cu)
    # ALiBi's slopes[head] (FlashAttention's alibi_slopes), f64 on the CPU for the reference
    vectors = case.vectors(torch, torch.Generator().manual_seed(4), 1, 4, 0, 0) if (
        case.vectors) else {}
    out, lse = attention_varlen(*leaves, offsets, offsets, max(LENGTHS), max(LENGTHS),
                                is_causal=causal, scale=SCALE, return_lse=True, arch=arch,
                                vectors={n: t.cuda() for n, t in vectors.items()} or None,
                                **_mods(case))
    out.backward(do)
    torch.cuda.synchronize()
    ref = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out, ref_lse = per_document(torch, case, *ref, cu, cu, SCALE,
                                    {n: t.cuda() for n, t in vectors.items()})
    ref_out.backward(do.double())
    close(out.detach(), ref_out.detach(), 2e-2, "O")
    close(lse, ref_lse.detach(), 1e-3, "lse")
    close_grads([x.grad for x in leaves], [x.grad for x in ref], 3e-2)


def _step(torch, q, k, v, do, cu, compiled=None):
    """O and the gradients of one training step (eager, or through `compiled`)."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    offsets = _offsets(torch, cu)
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    run = compiled or _attention
    out = run(*leaves, offsets, longest)
    out.backward(do)
    torch.cuda.synchronize()
    return out.detach(), [x.grad for x in leaves]


def _attention(q, k, v, offsets, longest):
    return attention_varlen(q, k, v, offsets, offsets, longest, longest, scale=SCALE, **STEP)


def test_torch_compile_fullgraph_matches_eager():
    """One graph (fullgraph: no break) of the forward and the backward op; a second batch of
    other lengths (recompiled or dynamic) as well."""
    torch = cuda_torch()
    torch._dynamo.reset()
    compiled = torch.compile(_attention, fullgraph=True)
    for lengths, seed in ((LENGTHS, 5), ((1000, 300, 17, 1, 512), 6)):
        q, k, v, do, cu = _inputs(torch, lengths, 4, 128, seed)
        want_out, want_grads = _step(torch, q, k, v, do, cu)
        got_out, got_grads = _step(torch, q, k, v, do, cu, compiled)
        assert torch.equal(got_out, want_out)
        for got, want in zip(got_grads, want_grads):
            assert torch.equal(got, want)


def test_a_training_step_captures_into_a_cuda_graph():
    """Captured once; replayed on new q, k, v, dO and new offsets (the same count and total, no
    longer a sequence than captured: the offsets are device data the kernels read), it gives
    eager's results on those."""
    torch = cuda_torch()
    q, k, v, do, cu = _inputs(torch, LENGTHS, 4, 128, seed=7)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    offsets = _offsets(torch, cu)

    def step():
        for x in leaves:
            x.grad = None
        out = _attention(*leaves, offsets, max(LENGTHS))
        out.backward(do)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiled, loaded and bound outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    grads = [x.grad for x in leaves]
    new_lengths = (1000, 300, 1, 17)
    fresh = _inputs(torch, new_lengths, 4, 128, seed=8)
    with torch.no_grad():
        for old, new in zip((*leaves, do), fresh[:4]):
            old.copy_(new)
        offsets.copy_(_offsets(torch, fresh[4]))
    graph.replay()
    torch.cuda.synchronize()
    want_out, want_grads = _step(torch, *fresh)
    assert torch.equal(out, want_out)
    for got, want in zip(grads, want_grads):
        assert torch.equal(got, want)


def test_opcheck_compares_the_fake_outputs_with_the_kernels():
    torch = cuda_torch()
    q, k, v, do, cu = _inputs(torch, LENGTHS, 4, 128, seed=9)
    offsets = _offsets(torch, cu)
    options = (max(LENGTHS), max(LENGTHS), SCALE, True, STEP["score_mod"], STEP["mask_mod"],
               ["cap"], [30.0], _arch(torch), [], [])
    forward = torch.ops.kgen.attention_varlen_fwd
    result = torch.library.opcheck(forward, (q, k, v, offsets, offsets, *options))
    assert set(result.values()) == {"SUCCESS"}, result
    out, lse = forward(q, k, v, offsets, offsets, *options)
    result = torch.library.opcheck(torch.ops.kgen.attention_varlen_bwd,
                                   (do, q, k, v, out, lse, offsets, offsets, *options, True))
    assert set(result.values()) == {"SUCCESS"}, result
