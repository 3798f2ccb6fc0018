"""On a GPU: sequences of kernels (kgen/runtime/sequence.py) against float64. Three row kernels
passing a workspace vector and an output (tests/programs/sequence_rows.kg), the attention
forward loop kernel then a row kernel reading its O from the workspace
(tests/programs/sequence_forward.kg); torch tensors (outputs given poisoned, or left out),
DeviceBuffers (the workspace one stream-ordered block), a CUDA-graph capture replayed on new
inputs, and an accumulate buffer zeroed before the kernel that adds into it does (by the row
kernel launched just before it: kgen/sequence_zeroing.py; tests/gpu/test_sequence_zeroing_gpu.py
has the other ways)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _load(name: str):
    import kgen

    return kgen.load_sequence(PROGRAMS / name)


def _close(out, ref, tol, what):
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape, what
    assert np.isfinite(out).all(), f"{what}: not finite"
    err = np.abs(out - ref).max() if out.size else 0.0
    scale = max(1.0, np.abs(ref).max() if ref.size else 0.0)
    assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _rows_inputs(seed, b, h, s):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    do = torch.randn(b, h, s, 128, device="cuda", generator=gen).bfloat16()
    o = torch.randn(b, h, s, 128, device="cuda", generator=gen).bfloat16()
    return do, o


def _rows_reference(do, o):
    do64, o64 = (t.double().cpu().numpy() for t in (do, o))
    d = (do64 * o64).sum(-1).astype(np.float32).astype(np.float64)  # D is an f32 buffer
    y = d[..., None] * do64
    return y, y.sum(-1)


@pytest.mark.parametrize("b, h, s", [(2, 3, 1000), (1, 1, 1), (1, 2, 17)])
def test_row_kernels_in_sequence_against_float64(b, h, s):
    _cuda()
    seq = _load("sequence_rows.kg")
    do, o = _rows_inputs(1, b, h, s)
    y_ref, m_ref = _rows_reference(do, o)
    # outputs left out: allocated by torch
    y, m = seq(dO=do, O=o)
    torch.cuda.synchronize()
    _close(y.cpu().numpy(), y_ref, 1e-5, "Y")
    _close(m.cpu().numpy(), m_ref, 1e-4, "M")
    # outputs given, poisoned: every element written
    y2 = torch.full_like(y, float("nan"))
    m2 = torch.full_like(m, float("nan"))
    got = seq(dO=do, O=o, Y=y2, M=m2)
    torch.cuda.synchronize()
    assert got[0] is y2 and got[1] is m2
    assert torch.equal(y2, y) and torch.equal(m2, m)


def test_the_forward_loop_kernel_then_a_row_kernel_against_float64():
    _cuda()
    seq = _load("sequence_forward.kg")
    gen = torch.Generator(device="cuda").manual_seed(2)
    b, h, s, t, d = 2, 3, 300, 257, 64
    q, k, v, do = (torch.randn(*shape, device="cuda", generator=gen).bfloat16()
                   for shape in ((b, h, s, d), (b, h, t, d), (b, h, t, d), (b, h, s, d)))
    lse, dd = seq(Q=q, K=k, V=v, dO=do)  # scale: its default, 0.125
    torch.cuda.synchronize()
    q64, k64, v64, do64 = (x.double() for x in (q, k, v, do))
    scores = (q64 @ k64.transpose(-1, -2)) * 0.125
    mask = torch.arange(t, device="cuda")[None, :] <= torch.arange(s, device="cuda")[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    lse_ref = torch.logsumexp(scores, -1)
    o_ref = torch.softmax(scores, -1) @ v64
    d_ref = (do64 * o_ref).sum(-1)
    _close(lse.cpu().numpy(), lse_ref.cpu().numpy(), 1e-4, "lse")
    _close(dd.cpu().numpy(), d_ref.cpu().numpy(), 3e-2, "D")


def test_device_buffers_take_a_stream_ordered_workspace():
    _cuda()
    import kgen
    import ml_dtypes

    seq = _load("sequence_rows.kg")
    rng = np.random.default_rng(3)
    do = rng.standard_normal((1, 2, 33, 128)).astype(ml_dtypes.bfloat16)
    o = rng.standard_normal((1, 2, 33, 128)).astype(ml_dtypes.bfloat16)
    y, m = seq(dO=kgen.DeviceBuffer.from_host(do), O=kgen.DeviceBuffer.from_host(o))
    torch.cuda.synchronize()
    y_ref, m_ref = _rows_reference(torch.from_numpy(do.astype(np.float32)),
                                   torch.from_numpy(o.astype(np.float32)))
    _close(y.to_host(), y_ref, 1e-5, "Y")
    _close(m.to_host(), m_ref, 1e-4, "M")


def test_a_sequence_captures_into_a_cuda_graph():
    """Captured with the workspace and outputs allocated inside the capture (torch's graph
    pool), replayed on new inputs with the outputs poisoned."""
    _cuda()
    seq = _load("sequence_rows.kg")
    do, o = _rows_inputs(4, 2, 4, 200)
    seq(dO=do, O=o)  # the kernels' first calls: checked and bound outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, m = seq(dO=do, O=o)
    fresh = _rows_inputs(5, 2, 4, 200)
    do.copy_(fresh[0])
    o.copy_(fresh[1])
    y.fill_(float("nan"))
    m.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    y_ref, m_ref = _rows_reference(do, o)
    _close(y.cpu().numpy(), y_ref, 1e-5, "Y")
    _close(m.cpu().numpy(), m_ref, 1e-4, "M")


def test_a_sequence_as_a_torch_op_eager_and_compiled():
    """kgen.torch_library.sequence_op: the op's eager call and a torch.compile'd one (its fake
    implementation gives the outputs' shapes) agree with the sequence's own call."""
    _cuda()
    from kgen.torch_library import sequence_op

    seq = _load("sequence_rows.kg")
    op = sequence_op(seq, name="rows_chain_gpu_test")
    do, o = _rows_inputs(6, 1, 2, 64)
    y, m = seq(dO=do, O=o)
    y1, m1 = op(do, o)
    compiled = torch.compile(lambda a, b: op(a, b), fullgraph=True)
    y2, m2 = compiled(do, o)
    torch.cuda.synchronize()
    assert torch.equal(y, y1) and torch.equal(m, m1)
    assert torch.equal(y, y2) and torch.equal(m, m2)


def test_an_accumulate_buffer_is_zeroed_before_the_kernel_that_adds_into_it():
    """The attention backward's sequence (kgen/attention_grad.py) launched through
    CompiledSequence._launch with its workspace given: dQacc (`out accumulate`, added into by
    the main kernel) poisoned with NaN, the other workspace and outputs too. D's row kernel,
    launched just before the main kernel, zeroes dQacc (the main kernel's own zeroing left
    out), so dQ matches float64, and so does a second launch on the first one's sums (dQacc not
    reset: were it not zeroed, dQ would double)."""
    _cuda()
    seq = _backward_sequence()
    assert seq.plan.zeroed_by_caller == (seq.plan.launches[1][0],)  # the main kernel
    b, h, s, t, d = 1, 2, 77, 130, 64
    args, refs = _backward_case(11, b, h, s, t, d)

    def poisoned(*shape, dtype=torch.float32):
        return torch.full(shape, float("nan"), dtype=dtype, device="cuda")

    values = {**args, "D": poisoned(b, h, s), "dQacc": poisoned(b, h, s, d),
              "dQ": poisoned(b, h, s, d, dtype=torch.bfloat16),
              "dK": poisoned(b, h, t, d, dtype=torch.bfloat16),
              "dV": poisoned(b, h, t, d, dtype=torch.bfloat16)}
    assert sorted(values) == sorted(buffer.name for buffer in seq.plan.buffers)
    raw = torch.cuda.current_stream().cuda_stream
    for _ in range(2):  # the second launch finds dQacc holding the first one's sums
        seq._launch(raw, values)
        torch.cuda.synchronize()
        _close(values["dQ"].double().cpu().numpy(), refs["dQ"].cpu().numpy(), 3e-2, "dQ")


def _backward_sequence(d: int = 64):
    """The attention backward's sequence (kgen/attention_grad.py) loaded for this GPU; skipped
    where its skeleton is not built yet."""
    from kgen.attention import _arch
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.errors import KgenError
    from kgen.sequence import build_sequence, load_built_sequence

    sig = BackwardSignature("bf16", d, False, _arch(torch.device("cuda")))
    module = backward_module(sig)
    try:
        built = build_sequence(module, module.sequences[0], sig.arch)
    except KgenError as err:
        if "not built yet" in str(err):
            pytest.skip(f"the attention backward's skeleton is not built yet: {err}")
        raise
    return load_built_sequence(built)


def _backward_case(seed: int, b: int, h: int, s: int, t: int, d: int):
    """The backward's arguments (O and lse from float64 attention) and dQ, dK, dV in float64."""
    import math

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", generator=gen).bfloat16()
                   for n in (s, t, t, s))
    scale = 1 / math.sqrt(d)
    q64, k64, v64, do64 = (x.double() for x in (q, k, v, do))
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - lse[..., None])
    o = (p @ v64).bfloat16()
    ds = p * (do64 @ v64.transpose(-1, -2) - (do64 * o.double()).sum(-1, keepdim=True))
    refs = {"dQ": ds @ k64 * scale, "dK": ds.transpose(-1, -2) @ q64 * scale,
            "dV": p.transpose(-1, -2) @ do64}
    args = {"dO": do, "O": o, "Q": q, "K": k, "V": v, "lse": lse.float(), "scale": scale}
    return args, refs


def _check_grads(seq, result, refs, what):
    got = dict(zip((b.name for b in seq.plan.outputs), result))
    for name, ref in refs.items():
        _close(got[name].double().cpu().numpy(), ref.cpu().numpy(), 3e-2, f"{what}: {name}")


def test_later_calls_of_a_signature_launch_its_kept_bindings():
    """The first call of a signature checks and keeps its kernels' Bindings; a second and a
    third call with fresh inputs (outputs left out, then given poisoned) go straight to them,
    as does a call on another stream (its workspace allocated for that stream); each against
    float64. Another shape is another signature."""
    _cuda()
    seq = _backward_sequence()
    b, h, s, t, d = 2, 3, 77, 130, 64
    for seed in (21, 22, 23):
        args, refs = _backward_case(seed, b, h, s, t, d)
        if seed == 23:
            given = {name: torch.full_like(args["Q" if name == "dQ" else "K"], float("nan"))
                     for name in refs}
            args.update(given)
        result = seq(**args)
        torch.cuda.synchronize()
        _check_grads(seq, result, refs, f"call {seed - 20}")
        if seed == 23:
            assert dict(zip((b.name for b in seq.plan.outputs), result)) == given
    assert len(seq._calls._bindings) == 2  # outputs left out, outputs given
    assert all(len(p.call_path._bindings) == 1 for p in seq.programs)  # checked once each
    side = torch.cuda.Stream()
    args, refs = _backward_case(24, b, h, s, t, d)
    side.wait_stream(torch.cuda.current_stream())  # the inputs are ready
    result = seq(stream=side, **args)
    side.synchronize()
    _check_grads(seq, result, refs, "on a side stream")
    args, refs = _backward_case(25, 1, 2, 200, 33, d)
    _check_grads(seq, seq(**args), refs, "another shape")
    assert len(seq._calls._bindings) == 3


def test_a_kept_signature_captures_into_a_cuda_graph():
    """A call of a kept signature inside torch.cuda.graph (workspace and outputs from the
    graph's pool), replayed on fresh inputs with the outputs poisoned, against float64."""
    _cuda()
    seq = _backward_sequence()
    b, h, s, t, d = 1, 4, 130, 77, 64
    args, _ = _backward_case(31, b, h, s, t, d)
    seq(**args)  # checked outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = seq(**args)
    fresh, refs = _backward_case(32, b, h, s, t, d)
    for name, value in fresh.items():
        if name != "scale":
            args[name].copy_(value)
    for out in result:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check_grads(seq, result, refs, "replayed")
