"""On a GPU: tile programs against float64 references computed here with torch: flash attention
forward (causal or not, ALiBi, softcap, GQA 8:1, LSE, head dims 64 and 128, a shifted causal
mask that masks whole rows: O = 0 and lse = -inf there), the looped MLP (N0 streamed), and the
row kernel D = rowsum(dO * O). Ragged lengths from {1, 17, 1000, 4097}; every output starts as
NaN. Both targets' code runs on an H100/H200 (sm_80 code runs there too)."""
from __future__ import annotations

import math

import pytest

from kgen import ir
from kgen.api import build_verified, load_built

from tests import loop_kernels as lk

pytestmark = pytest.mark.gpu

ARCHS = [ir.Arch.SM80, ir.Arch.SM90A]


def _needs(arch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if arch is ir.Arch.SM90A and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    return torch


def _load(kernel, arch):
    """The kernel as a verified one (the front end's verify of loops is another branch)."""
    return load_built(build_verified(kernel, arch))


def _close(out, ref, tol, what):
    """max |out - ref| within tol x max(1, max |ref|), infinities equal, no NaN."""
    torch = pytest.importorskip("torch")
    out = out.double()
    assert not torch.isnan(out).any(), f"{what}: NaN (an element not written?)"
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf), f"{what}: infinities differ"
    assert torch.equal(out[inf], ref[inf]), f"{what}: infinities differ in sign"
    finite = ~inf
    if finite.any():
        err = (out[finite] - ref[finite]).abs().max().item()
        scale = max(1.0, ref[finite].abs().max().item())
        assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def attention_reference(q, k, v, scale, *, causal=False, shift=None, slope=None, cap=None):
    torch = pytest.importorskip("torch")
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    x = scale * (q.double() @ k.transpose(-1, -2))
    s, t = x.shape[-2:]
    row = torch.arange(s, device=x.device, dtype=torch.float64)[:, None]
    col = torch.arange(t, device=x.device, dtype=torch.float64)[None, :]
    if cap is not None:
        x = cap * torch.tanh(x / cap)
    if slope is not None:
        x = x - slope * (row - col)
    if causal or shift is not None:
        x = torch.where(col + (shift or 0.0) <= row, x, -math.inf)
    m = x.amax(-1)
    m_use = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(x - m_use[..., None])
    l_sum = p.sum(-1)
    o = torch.where(l_sum[..., None] == 0, 0.0, (p @ v) / l_sum[..., None])
    lse = torch.where(l_sum == 0, -math.inf, m + torch.log(l_sum))
    return o, lse


# (head dim, S, T, variant): a covering set of ragged lengths and each variant once at least
CASES = [
    (128, 1, 1, {}),
    (128, 17, 1000, {"causal": True}),
    (64, 1000, 17, {}),
    (64, 4097, 4097, {"causal": True}),
    (128, 1000, 4097, {"alibi": True}),
    (64, 17, 1000, {"softcap": 30.0}),
    (128, 1000, 1000, {"gqa": True, "causal": True}),
    (64, 1000, 17, {"shift": True}),  # rows below the shift see no column: O = 0, lse = -inf
    (128, 17, 4097, {"causal": True, "dtype": ir.DType.F16}),
    # the mma.sync skeleton's warps of 16 rows (a written tile: 8 warps), of 32 rows at a head
    # dim of 96 (12 chunks a row: the swizzle in groups of 4), and the rulebook's fall back to 16
    # rows where a long score chain would not fit 32 in the registers
    (128, 1000, 4097, {"causal": True, "tile": (128, 64)}),
    (96, 300, 1000, {"causal": True}),
    (128, 700, 1000, {"gqa": True, "softcap": 50.0, "alibi": True, "causal": True}),
    # one slot each of K and V, copied and waited apart (FlashAttention-2's ring): the
    # rulebook's head dim 256, and written at 128 (8 warps) and 64 (4 warps)
    (256, 1000, 4097, {"causal": True}),
    (256, 17, 1000, {"alibi": True}),
    (128, 1000, 1000, {"gqa": True, "causal": True, "tile": (128, 64), "stages": 1}),
    (64, 4097, 17, {"tile": (64, 64), "stages": 1}),
    # the maximum of the raw scores and exp(scale * (x - m)) (kgen.attention's program for a
    # positive scale): one multiply-add per score; whole rows masked (shift) give O = 0
    (128, 1000, 4097, {"causal": True, "raw_max": True}),
    (64, 17, 1000, {"raw_max": True}),
    (256, 1000, 1000, {"gqa": True, "causal": True, "raw_max": True}),
    (64, 1000, 17, {"shift": True, "raw_max": True}),
    # kgen.attention's lazy reference maximum: the rescale skipped where a warp's rows keep it
    (128, 1000, 4097, {"causal": True, "raw_max": True, "lazy": True}),
    (64, 17, 1000, {"raw_max": True, "lazy": True}),
    (256, 1000, 1000, {"gqa": True, "causal": True, "raw_max": True, "lazy": True}),
    (64, 1000, 17, {"shift": True, "raw_max": True, "lazy": True}),
]


def _id(case):
    d, s, t, variant = case
    return f"d{d}-s{s}-t{t}-" + ("-".join(variant) or "plain")


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_attention_matches_float64(arch, case):
    torch = _needs(arch)
    d, s, t, variant = case
    kernel = lk.attention(d, arch=arch, **variant)
    run = _load(kernel, arch)
    gen = torch.Generator(device="cuda").manual_seed(s * 7 + t)
    b, h = 2, 8 if variant.get("gqa") else 3
    hkv = 1 if variant.get("gqa") else h
    dtype = torch.float16 if variant.get("dtype") is ir.DType.F16 else torch.bfloat16
    q = torch.randn(b, h, s, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, hkv, t, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, hkv, t, d, device="cuda", generator=gen).to(dtype)
    o = torch.full((b, h, s, d), math.nan, device="cuda", dtype=dtype)
    lse = torch.full((b, h, s), math.nan, device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    extra = {}
    if variant.get("alibi"):
        extra["slope"] = 0.0625
    if variant.get("softcap"):
        extra["cap"] = variant["softcap"]
    if variant.get("shift"):
        extra["shift"] = float(s - t) if s > t else 100.0
    run(Q=q, K=k, V=v, O=o, lse=lse, scale=scale, **extra)
    torch.cuda.synchronize()
    ref_o, ref_lse = attention_reference(
        q, k, v, scale, causal=variant.get("causal", False), shift=extra.get("shift"),
        slope=extra.get("slope"), cap=extra.get("cap"))
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")
    if variant.get("shift"):
        masked = int(extra["shift"])
        assert torch.equal(o[:, :, :masked].float(), torch.zeros_like(o[:, :, :masked].float()))
        assert torch.isneginf(lse[:, :, :masked]).all()


def test_outputs_left_out_are_allocated_and_a_signature_is_checked_once():
    """The outputs come back (allocated when left out); a second call of the same signature
    at other addresses (the fast path) computes on the new inputs."""
    torch = _needs(ir.Arch.SM80)
    run = _load(lk.attention(64, gqa=True, causal=True), ir.Arch.SM80)
    results = []
    for seed in (1, 2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(1, 4, 300, 64, device="cuda", generator=gen).bfloat16()
        k = torch.randn(1, 2, 257, 64, device="cuda", generator=gen).bfloat16()
        v = torch.randn(1, 2, 257, 64, device="cuda", generator=gen).bfloat16()
        o, lse = run(Q=q, K=k, V=v)
        torch.cuda.synchronize()
        ref_o, ref_lse = attention_reference(q, k, v, 0.125, causal=True)
        _close(o, ref_o, 2e-2, "O")
        _close(lse, ref_lse, 1e-4, "lse")
        results.append(o)
    assert len(run._calls._bindings) == 1  # the gemms' call path: one binding
    assert not torch.equal(results[0], results[1])


def test_gqa_heads_must_divide():
    torch = _needs(ir.Arch.SM80)
    from kgen.errors import KgenRuntimeError

    run = _load(lk.attention(64, gqa=True), ir.Arch.SM80)
    q = torch.randn(1, 3, 17, 64, device="cuda").bfloat16()
    k = torch.randn(1, 2, 17, 64, device="cuda").bfloat16()
    o = torch.empty_like(q)
    lse = torch.empty(1, 3, 17, device="cuda")
    with pytest.raises(KgenRuntimeError, match="multiple of the KV heads"):
        run(Q=q, K=k, V=k, O=o, lse=lse)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("m, n0, layout", [(1, 8, "col"), (17, 1000, "col"), (1000, 4104, "row"),
                                           (4097, 1024, "col")])
def test_mlp_loop_matches_float64(arch, m, n0, layout):
    torch = _needs(arch)
    w_layout = ir.Layout.COL if layout == "col" else ir.Layout.ROW
    run = _load(lk.mlp(arch=arch, w_layout=w_layout), arch)
    gen = torch.Generator(device="cuda").manual_seed(m + n0)
    x = torch.randn(m, 256, device="cuda", generator=gen).bfloat16()
    w0 = (torch.randn(256, n0, device="cuda", generator=gen) / 16).bfloat16()
    w1 = (torch.randn(n0, 128, device="cuda", generator=gen) / math.sqrt(n0)).bfloat16()
    b0 = torch.randn(n0, device="cuda", generator=gen)
    if w_layout is ir.Layout.COL:  # column-major: the transpose of a contiguous tensor
        w0 = w0.t().contiguous().t()
        w1 = w1.t().contiguous().t()
    y = torch.full((m, 128), math.nan, device="cuda", dtype=torch.bfloat16)
    run(X=x, W0=w0, W1=w1, Y=y, b0=b0)
    torch.cuda.synchronize()
    hidden = torch.nn.functional.gelu(x.double() @ w0.double() + b0.double())
    _close(y, hidden @ w1.double(), 2e-2, "Y")


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("cols, s", [(128, 1), (128, 4097), (64, 17), (256, 1000)])
def test_row_kernel_matches_float64(arch, cols, s):
    torch = _needs(arch)
    run = _load(lk.rowdot(cols, arch=arch), arch)
    do = torch.randn(2, 3, s, cols, device="cuda").bfloat16()
    o = torch.randn(2, 3, s, cols, device="cuda").bfloat16()
    d = torch.full((2, 3, s), math.nan, device="cuda")
    run(dO=do, O=o, D=d)
    torch.cuda.synchronize()
    _close(d, (do.double() * o.double()).sum(-1), 1e-5, "D")


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("cols, s, heads", [(128, 4097, True), (72, 17, False), (256, 1, True)])
def test_row_kernel_with_a_tensor_output(arch, cols, s, heads):
    """RMSNorm: a row value broadcast over its row, a column vector, a tensor output."""
    torch = _needs(arch)
    run = _load(lk.rmsnorm(cols, arch=arch, heads=heads), arch)
    lead = (2, 3) if heads else ()
    x = torch.randn(*lead, s, cols, device="cuda").bfloat16()
    w = torch.randn(cols, device="cuda")
    y = torch.full((*lead, s, cols), math.nan, device="cuda", dtype=torch.bfloat16)
    r = torch.full((*lead, s), math.nan, device="cuda")
    run(X=x, w=w, Y=y, r=r)
    torch.cuda.synchronize()
    ref_r = torch.rsqrt((x.double() ** 2).sum(-1) / cols + 1e-5)
    _close(r, ref_r, 1e-5, "r")
    _close(y, x.double() * ref_r[..., None] * w.double(), 2e-2, "Y")


def test_load_takes_the_ir_kernel():
    """kgen.load(kernel) goes the same way (verify first: the front end's branch accepts
    loops; on a tree without it this is skipped)."""
    torch = _needs(ir.Arch.SM80)
    import kgen
    from kgen.errors import KgenError
    from kgen.verify import verify

    kernel = lk.rowdot(128)
    try:
        verify(ir.Module((kernel,)))
    except KgenError as err:
        pytest.skip(f"this tree's verify refuses row kernels ({err})")
    run = kgen.load(kernel, tuned=False)
    do = torch.randn(1, 2, 33, 128, device="cuda").bfloat16()
    d = torch.full((1, 2, 33), math.nan, device="cuda")
    run(dO=do, O=do, D=d)
    torch.cuda.synchronize()
    _close(d, (do.double() ** 2).sum(-1), 1e-5, "D")


# The front end's NumPy reference of tile programs (kgen/reference_tiles.py, another branch)
# evaluates block by block with the plan's block size: the kernels match it too.
REFERENCE_CASES = {
    "attention_gqa_alibi_softcap_causal": (
        lambda: lk.attention(64, gqa=True, alibi=True, softcap=30.0, causal=True),
        lambda torch: dict(Q=torch.randn(1, 4, 130, 64), K=torch.randn(1, 2, 257, 64),
                           V=torch.randn(1, 2, 257, 64))),
    "attention_shift": (
        lambda: lk.attention(128, shift=True),
        lambda torch: dict(Q=torch.randn(2, 1, 77, 128), K=torch.randn(2, 1, 33, 128),
                           V=torch.randn(2, 1, 33, 128))),
    "mlp_row": (
        lambda: lk.mlp(w_layout=ir.Layout.ROW),
        lambda torch: dict(X=torch.randn(100, 256), W0=torch.randn(256, 1000) / 16,
                           W1=torch.randn(1000, 128) / 32, b0=torch.randn(1000))),
    "rmsnorm": (
        lambda: lk.rmsnorm(72),
        lambda torch: dict(X=torch.randn(2, 3, 33, 72), w=torch.randn(72))),
}


@pytest.mark.parametrize("which", list(REFERENCE_CASES))
def test_matches_the_block_by_block_reference(which):
    torch = _needs(ir.Arch.SM80)
    pytest.importorskip("kgen.reference_tiles", reason="the front end's reference of loops")
    import numpy as np

    from kgen.reference import compare, evaluate, host_dtype

    make_kernel, make_inputs = REFERENCE_CASES[which]
    kernel = make_kernel()
    built = build_verified(kernel, ir.Arch.SM80)
    run = load_built(built)
    torch.manual_seed(3)
    inputs = {}
    for name, value in make_inputs(torch).items():
        p = kernel.param(name)
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[
            p.dtype.dsl_name]
        inputs[name] = value.to(dtype).cuda()
        if p.layout is ir.Layout.COL:
            inputs[name] = inputs[name].t().contiguous().t()
    scalars = {"shift": 44.0} if which == "attention_shift" else {}
    outputs = run(**inputs, **scalars)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    torch.cuda.synchronize()
    host = {name: value.float().cpu().numpy().astype(host_dtype(kernel.param(name).dtype))
            for name, value in inputs.items()}
    block = getattr(built.plan, "block", None)
    reference = evaluate(kernel, host, scalars, block=block)
    names = [p.name for p in kernel.params if p.role is ir.Role.OUT]
    for name, out in zip(names, outputs):
        result = compare(out.float().cpu().numpy(), np.asarray(reference[name]),
                         kernel.param(name).dtype)
        assert result.ok, (name, result)
