"""On a GPU: kgen.attention against float64 attention computed here with torch (and against
torch's SDPA where SDPA defines the case): plain, causal, GQA, a softcap score_mod, a window
mask_mod, bottom-right causal with whole rows masked (O = 0, lse = -inf), head dims 64, 96,
128, 192, 256 and D_qk 192 / D_v 128, fp16; fresh random inputs each case. Also the windowed
example through the program runtime (its blocks skipped by the loop's bounds), a CUDA graph
capture."""
from __future__ import annotations

import math

import pytest

import kgen
from kgen.api import build_file, load_built

pytestmark = pytest.mark.gpu


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def reference(q, k, v, scale, *, causal=False, cap=None, keep=None):
    """O and lse in float64; `keep(row, col, S, T)` a boolean mask; rows that keep nothing
    give O = 0 and lse = -inf (kgen's guards)."""
    torch = _torch()
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    x = scale * (q.double() @ k.transpose(-1, -2))
    s, t = x.shape[-2:]
    row = torch.arange(s, device=x.device, dtype=torch.float64)[:, None]
    col = torch.arange(t, device=x.device, dtype=torch.float64)[None, :]
    if cap is not None:
        x = cap * torch.tanh(x / cap)
    mask = torch.ones(s, t, dtype=torch.bool, device=x.device)
    if causal:
        mask &= col <= row
    if keep is not None:
        mask &= keep(row, col, s, t)
    x = torch.where(mask, x, -math.inf)
    m = x.amax(-1)
    m_use = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(x - m_use[..., None])
    total = p.sum(-1)
    o = torch.where(total[..., None] == 0, 0.0, (p @ v) / total[..., None])
    lse = torch.where(total == 0, -math.inf, m + torch.log(total))
    return o, lse


def _close(out, ref, tol, what):
    torch = _torch()
    out = out.double()
    assert not torch.isnan(out).any(), f"{what}: NaN"
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf), f"{what}: infinities differ"
    finite = ~inf
    if finite.any():
        err = (out[finite] - ref[finite]).abs().max().item()
        scale = max(1.0, ref[finite].abs().max().item())
        assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _inputs(torch, b, h, hkv, s, t, d_qk, d_v, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, s, d_qk, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, hkv, t, d_qk, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, hkv, t, d_v, device="cuda", generator=gen).to(dtype)
    return q, k, v


# (d_qk, d_v, S, T, heads q/kv, options)
CASES = [
    (64, 64, 1, 1, (2, 2), {}),
    (128, 128, 1000, 1000, (4, 4), {"is_causal": True}),
    (128, 128, 17, 4097, (8, 1), {"enable_gqa": True}),
    (64, 64, 1000, 1000, (8, 2), {"enable_gqa": True, "is_causal": True}),
    (96, 96, 1000, 17, (2, 2), {}),
    (192, 192, 300, 1000, (2, 2), {"is_causal": True}),
    (256, 256, 1000, 300, (2, 2), {}),
    (192, 128, 1000, 1000, (2, 2), {"is_causal": True}),
    (128, 128, 4097, 4097, (2, 2), {"is_causal": True, "fp16": True}),
]


def _id(case):
    d, dv, s, t, heads, opts = case
    return f"d{d}x{dv}-s{s}-t{t}-h{heads[0]}:{heads[1]}-" + ("-".join(opts) or "plain")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_matches_float64_and_sdpa(case):
    torch = _torch()
    d, dv, s, t, (h, hkv), opts = case
    dtype = torch.float16 if opts.get("fp16") else torch.bfloat16
    q, k, v = _inputs(torch, 2, h, hkv, s, t, d, dv, dtype, seed=s * 31 + t + d)
    causal = opts.get("is_causal", False)
    o, lse = kgen.attention(q, k, v, is_causal=causal, enable_gqa=opts.get("enable_gqa", False),
                            return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, 1.0 / math.sqrt(d), causal=causal)
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")
    # SDPA's causal mask is top-left aligned too: col 0 stays, no row is masked in full
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=opts.get("enable_gqa", False))
    _close(o, sdpa.double(), 3e-2, "O against SDPA")


def test_softcap_score_mod():
    torch = _torch()
    q, k, v = _inputs(torch, 2, 4, 4, 1000, 1000, 128, 128, torch.bfloat16, seed=5)
    q = q * 4  # scores past the cap
    o = kgen.attention(q, k, v, score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0})
    torch.cuda.synchronize()
    ref_o, _ = reference(q, k, v, 1.0 / math.sqrt(128), cap=30.0)
    _close(o, ref_o, 2e-2, "O")


@pytest.mark.parametrize("s, t", [(1000, 1000), (17, 4097), (4097, 1000)])
def test_window_mask_mod_bottom_right(s, t):
    """A window of 256 keys aligned bottom-right: with S > T the first S - T rows keep no key
    (O = 0, lse = -inf); the kernel skips the blocks outside each tile's windows."""
    torch = _torch()
    q, k, v = _inputs(torch, 1, 4, 2, s, t, 64, 64, torch.bfloat16, seed=s + t)
    mask = "(col <= row + T - S) * (col > row + T - S - window)"
    o, lse = kgen.attention(q, k, v, mask_mod=mask, scalars={"window": 256.0}, enable_gqa=True,
                            return_lse=True)
    torch.cuda.synchronize()

    def keep(row, col, rows, length):
        return (col <= row + length - rows) & (col > row + length - rows - 256)

    ref_o, ref_lse = reference(q, k, v, 0.125, keep=keep)
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")
    if s > t:
        dead = s - t
        assert torch.equal(o[:, :, :dead].float(), torch.zeros_like(o[:, :, :dead].float()))
        assert torch.isneginf(lse[:, :, :dead]).all()


def test_window_example_through_the_program_runtime():
    """examples/attention_fwd_window.kg on both targets' code, outputs poisoned with NaN."""
    torch = _torch()
    for arch in ("sm_80", "sm_90a"):
        if arch == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
            continue
        run = load_built(build_file("examples/attention_fwd_window.kg", arch))
        for s, t in ((1000, 4097), (4097, 1000), (300, 300)):
            q, k, v = _inputs(torch, 2, 4, 2, s, t, 128, 128, torch.bfloat16, seed=3 * s + t)
            o = torch.full((2, 4, s, 128), math.nan, device="cuda", dtype=torch.bfloat16)
            lse = torch.full((2, 4, s), math.nan, device="cuda")
            run(Q=q, K=k, V=v, O=o, lse=lse, scale=0.0884, window=100.0)
            torch.cuda.synchronize()

            def keep(row, col, rows, length):
                return (col <= row + length - rows) & (col > row + length - rows - 100)

            ref_o, ref_lse = reference(q, k, v, 0.0884, keep=keep)
            _close(o, ref_o, 2e-2, f"O {arch} {s}x{t}")
            _close(lse, ref_lse, 1e-4, f"lse {arch} {s}x{t}")


def test_cuda_graph_capture():
    torch = _torch()
    q, k, v = _inputs(torch, 1, 2, 2, 300, 300, 64, 64, torch.bfloat16, seed=9)
    first = kgen.attention(q, k, v, is_causal=True)  # compiled and loaded outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kgen.attention(q, k, v, is_causal=True)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref_o, _ = reference(q, k, v, 0.125, causal=True)
    _close(captured, ref_o, 2e-2, "O replayed")
    assert not torch.equal(first, captured)


def _kgen_run(*args):
    import json

    from click.testing import CliRunner

    from kgen.cli import cli

    result = CliRunner().invoke(cli, ["run", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


@pytest.mark.parametrize("sizes", ["B=2,H=8,HKV=2,S=1000,T=4097", "B=1,H=4,HKV=4,S=4097,T=1000",
                                   "B=1,H=2,HKV=1,S=17,T=17"])
def test_kgen_run_checks_the_window_example(sizes):
    _torch()
    data = _kgen_run("examples/attention_fwd_window.kg", "--size", sizes)
    assert data["checked"] and data["ok"] is True, data["checks"]


def test_kgen_run_bench_compares_with_sdpa_and_flex():
    """attention_fwd.kg (causal): SDPA's backends and FlexAttention timed in the same run; a
    backend this GPU lacks is a note, never a failure."""
    torch = _torch()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("attention_fwd.kg targets sm_90a")
    data = _kgen_run("examples/attention_fwd.kg", "--bench", "--iters", "10",
                     "--size", "B=2,H=8,HKV=8,S=2048,T=2048")
    assert data["ok"] is True and data["time_ms"] > 0
    baselines = data["baselines"]
    named = ("SDPA cuDNN", "SDPA flash", "SDPA efficient", "FlexAttention")
    for name in named:
        assert name in baselines or any(name in note for note in data["notes"]), data["notes"]
    assert "SDPA flash" in baselines, data["notes"]  # torch's flash runs bf16 on Hopper
    assert all(b["time_ms"] > 0 and b["speedup"] > 0 for b in baselines.values())
    assert any("causal (top-left)" in note for note in data["notes"])
