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
from tests.gpu.attention_checks import close, cuda_torch
from kgen.api import build_file, load_built

pytestmark = pytest.mark.gpu


def reference(q, k, v, scale, *, causal=False, cap=None, keep=None, bias=None, mod=None):
    """O and lse in float64; `keep(row, col, S, T)` a boolean mask (broadcastable to
    [B, H, S, T]); `bias` added to the scaled score; `mod(x, row, col, batch, head)` the score
    after it; rows that keep no key give O = 0 and lse = -inf (kgen's guards)."""
    torch = cuda_torch()
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    x = scale * (q.double() @ k.transpose(-1, -2))
    s, t = x.shape[-2:]
    row = torch.arange(s, device=x.device, dtype=torch.float64)[:, None]
    col = torch.arange(t, device=x.device, dtype=torch.float64)[None, :]
    if bias is not None:
        x = x + bias.double()
    if mod is not None:
        batch = torch.arange(x.shape[0], device=x.device, dtype=torch.float64)[:, None, None, None]
        head = torch.arange(x.shape[1], device=x.device, dtype=torch.float64)[None, :, None, None]
        x = mod(x, row, col, batch, head)
    if cap is not None:
        x = cap * torch.tanh(x / cap)
    mask = torch.ones(s, t, dtype=torch.bool, device=x.device)
    if causal:
        mask = mask & (col <= row)
    if keep is not None:
        mask = mask & keep(row, col, s, t)
    x = torch.where(mask, x, -math.inf)
    m = x.amax(-1)
    m_use = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(x - m_use[..., None])
    total = p.sum(-1)
    o = torch.where(total[..., None] == 0, 0.0, (p @ v) / total[..., None])
    lse = torch.where(total == 0, -math.inf, m + torch.log(total))
    return o, lse


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
    torch = cuda_torch()
    d, dv, s, t, (h, hkv), opts = case
    dtype = torch.float16 if opts.get("fp16") else torch.bfloat16
    q, k, v = _inputs(torch, 2, h, hkv, s, t, d, dv, dtype, seed=s * 31 + t + d)
    causal = opts.get("is_causal", False)
    o, lse = kgen.attention(q, k, v, is_causal=causal, enable_gqa=opts.get("enable_gqa", False),
                            return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, 1.0 / math.sqrt(d), causal=causal)
    close(o, ref_o, 2e-2, "O")
    close(lse, ref_lse, 1e-4, "lse")
    # SDPA's causal mask is top-left aligned too: col 0 stays, no row is masked in full
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=opts.get("enable_gqa", False))
    close(o, sdpa.double(), 3e-2, "O against SDPA")


def test_softcap_score_mod():
    torch = cuda_torch()
    q, k, v = _inputs(torch, 2, 4, 4, 1000, 1000, 128, 128, torch.bfloat16, seed=5)
    q = q * 4  # scores past the cap
    o, lse = kgen.attention(q, k, v, score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0},
                            return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, 1.0 / math.sqrt(128), cap=30.0)
    close(o, ref_o, 2e-2, "O")
    # the body's tanh is tanh.approx.f32 (plan.tanh; relative error at most 2^-10.99) of
    # score * (1 / cap) (plan.division, within 1.5 ulp): each score moves by at most about
    # 30 * 2^-10.99, so the log-sum-exp does too (measured on an H200: 1.5e-4)
    err = (lse.double() - ref_lse).abs().max().item()
    print(f"softcap 30: lse max error {err:.3g} against float64 (bound {30 * 2**-10.99:.3g}), "
          f"O max error {(o.double() - ref_o).abs().max().item():.3g}")
    assert err <= 30 * 2**-10.99


@pytest.mark.parametrize("s, t", [(1000, 1000), (17, 4097), (4097, 1000)])
def test_window_mask_mod_bottom_right(s, t):
    """A window of 256 keys aligned bottom-right: with S > T the first S - T rows keep no key
    (O = 0, lse = -inf); the kernel skips the blocks outside each tile's windows."""
    torch = cuda_torch()
    q, k, v = _inputs(torch, 1, 4, 2, s, t, 64, 64, torch.bfloat16, seed=s + t)
    mask = "(col <= row + T - S) * (col > row + T - S - window)"
    o, lse = kgen.attention(q, k, v, mask_mod=mask, scalars={"window": 256.0}, enable_gqa=True,
                            return_lse=True)
    torch.cuda.synchronize()

    def keep(row, col, rows, length):
        return (col <= row + length - rows) & (col > row + length - rows - 256)

    ref_o, ref_lse = reference(q, k, v, 0.125, keep=keep)
    close(o, ref_o, 2e-2, "O")
    close(lse, ref_lse, 1e-4, "lse")
    if s > t:
        dead = s - t
        assert torch.equal(o[:, :, :dead].float(), torch.zeros_like(o[:, :, :dead].float()))
        assert torch.isneginf(lse[:, :, :dead]).all()


def test_window_example_through_the_program_runtime():
    """examples/attention_fwd_window.kg on both targets' code, outputs poisoned with NaN."""
    torch = cuda_torch()
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
            close(o, ref_o, 2e-2, f"O {arch} {s}x{t}")
            close(lse, ref_lse, 1e-4, f"lse {arch} {s}x{t}")


def test_cuda_graph_capture():
    torch = cuda_torch()
    q, k, v = _inputs(torch, 1, 2, 2, 300, 300, 64, 64, torch.bfloat16, seed=9)
    first = kgen.attention(q, k, v, is_causal=True)  # compiled and loaded outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kgen.attention(q, k, v, is_causal=True)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref_o, _ = reference(q, k, v, 0.125, causal=True)
    close(captured, ref_o, 2e-2, "O replayed")
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
    cuda_torch()
    data = _kgen_run("examples/attention_fwd_window.kg", "--size", sizes)
    assert data["checked"] and data["ok"] is True, data["checks"]


def test_kgen_run_bench_compares_with_sdpa_and_flex():
    """attention_fwd.kg (causal): SDPA's backends and FlexAttention timed in the same run; a
    backend this GPU lacks is a note, never a failure."""
    torch = cuda_torch()
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


# ---------------------------------------------------------------------------------------------
# attn_mask, vectors and batch/head in the mods, on both skeletons (the sm_80 one forced on a
# newer GPU; sm_90a where the device is one)


def _archs():
    torch = cuda_torch()
    return ["sm_80"] + (["sm_90a"] if torch.cuda.get_device_capability() == (9, 0) else [])


@pytest.fixture(params=["sm_80", "sm_90a"])
def arch(request, monkeypatch):
    from kgen import attention as kattention

    if request.param not in _archs():
        pytest.skip(f"{request.param} does not run here")
    monkeypatch.setattr(kattention, "_arch", lambda device: request.param)
    return request.param


@pytest.mark.parametrize("s, t, mask_shape, causal", [
    (1000, 1000, (1, 4, 1000, 1000), True),
    (17, 4097, (2, 1, 1, 4097), False),
    (1000, 17, (1000, 17), False),
    (4097, 4097, (2, 4, 4097, 4097), True),
])
def test_additive_bias(arch, s, t, mask_shape, causal):
    """A float attn_mask broadcast over batch, heads or rows (stride 0), at ragged lengths
    (T = 17: rows 34 bytes apart, copied to 16-byte rows); causal blocks still skipped."""
    torch = cuda_torch()
    q, k, v = _inputs(torch, 2, 4, 4, s, t, 128, 128, torch.bfloat16, seed=7 * s + t)
    gen = torch.Generator(device="cuda").manual_seed(s + 3 * t)
    bias = (2 * torch.randn(mask_shape, device="cuda", generator=gen)).to(torch.bfloat16)
    o, lse = kgen.attention(q, k, v, bias, is_causal=causal, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, 1 / math.sqrt(128), causal=causal, bias=bias)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")
    if not causal:
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        close(o, sdpa.double(), 3e-2, "O against SDPA")


@pytest.mark.parametrize("d, s, t, causal", [(256, 1000, 4097, True), (256, 4097, 1000, False),
                                          (128, 700, 700, True)])
def test_the_lazy_maximum_moves_where_the_scores_climb(arch, d, s, t, causal):
    """kgen.attention's reference maximum (sm_90a at D_v 256: lazy_maximum) moves only where a
    block's maximum passes it by more than LAZY_MAX: keys whose scores climb along T (k scaled
    up to 6x) move it block after block, the rescale then runs for some warps and not others;
    the float64 reference (the eager maximum at D 128 and on sm_80 alike)."""
    torch = cuda_torch()
    q, k, v = _inputs(torch, 2, 4, 4, s, t, d, d, torch.bfloat16, seed=11 * s + t)
    climb = 1 + 5 * torch.arange(t, device="cuda", dtype=torch.float32) / t
    k = (k.float() * climb[:, None]).to(torch.bfloat16)
    o, lse = kgen.attention(q, k, v, is_causal=causal, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(q, k, v, 1 / math.sqrt(d), causal=causal)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")


def test_bool_mask_keeps_what_sdpa_keeps(arch):
    """A bool key-padding mask [B, 1, 1, T]: True keeps; against float64 and SDPA."""
    torch = cuda_torch()
    s, t = 1000, 4097
    q, k, v = _inputs(torch, 2, 4, 2, s, t, 128, 128, torch.bfloat16, seed=41)
    lengths = torch.tensor([4097, 1500], device="cuda")
    keep = torch.arange(t, device="cuda")[None, :] < lengths[:, None]
    mask = keep[:, None, None, :]
    o = kgen.attention(q, k, v, mask, enable_gqa=True)
    torch.cuda.synchronize()
    ref_o, _ = reference(q, k, v, 1 / math.sqrt(128), keep=lambda *a: mask)
    close(o, ref_o, 2e-2, f"O {arch}")
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                            enable_gqa=True)
    close(o, sdpa.double(), 3e-2, "O against SDPA")


@pytest.mark.parametrize("s", [17, 1000, 4097])
def test_alibi_by_head_and_batch_in_the_mods(arch, s):
    """ALiBi with a slope per query head (slopes[head]) and a term per batch, causal, GQA."""
    torch = cuda_torch()
    q, k, v = _inputs(torch, 2, 8, 2, s, s, 128, 128, torch.bfloat16, seed=s + 5)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 8) for h in range(8)], device="cuda")
    o, lse = kgen.attention(q, k, v, is_causal=True, enable_gqa=True,
                            score_mod="score - slopes[head] * (row - col) + 0.25 * batch",
                            vectors={"slopes": slopes}, return_lse=True)
    torch.cuda.synchronize()

    def mod(x, row, col, batch, head):
        return x - slopes.double()[None, :, None, None] * (row - col) + 0.25 * batch

    ref_o, ref_lse = reference(q, k, v, 1 / math.sqrt(128), causal=True, mod=mod)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")


@pytest.mark.parametrize("s", [1000, 4097])
def test_document_mask_of_packed_documents(arch, s):
    """Packed documents of random lengths: qd[row] == kd[col] (the same ids under two names),
    causal; a different packing per batch; the causal bound still skips blocks."""
    torch = cuda_torch()
    q, k, v = _inputs(torch, 2, 4, 4, s, s, 128, 128, torch.bfloat16, seed=s + 9)
    gen = torch.Generator(device="cuda").manual_seed(s)
    ids = torch.cumsum((torch.rand(2, s, device="cuda", generator=gen) < 0.004).int(), dim=1)
    o, lse = kgen.attention(q, k, v, is_causal=True, mask_mod="qd[row] == kd[col]",
                            vectors={"qd": ids, "kd": ids}, return_lse=True)
    torch.cuda.synchronize()
    same = (ids[:, None, :, None] == ids[:, None, None, :])
    ref_o, ref_lse = reference(q, k, v, 1 / math.sqrt(128), causal=True,
                               keep=lambda *a: same)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")


@pytest.mark.parametrize("s, t, causal, order", [
    (1000, 1000, False, "sorted"), (4097, 4097, False, "sorted"), (300, 4097, False, "sorted"),
    (1000, 1000, False, "random"), (1000, 1000, True, "random"), (4097, 1000, False, "blocks"),
])
def test_document_mask_scan_skips_only_what_is_masked(arch, s, t, causal, order):
    """The equality's scan (plan.bounds.equalities): sorted ids (long documents: whole blocks
    inside, folded), ids in no order (few values: the scan's range is all there is, nothing
    folded), ids in runs of 128 that repeat (tiles with one value, runs not contiguous),
    queries and keys of different lengths and ids (some rows keep nothing: O 0, lse -inf)."""
    torch = cuda_torch()
    q, k, v = _inputs(torch, 2, 4, 4, s, t, 128, 128, torch.bfloat16, seed=s + t + 3)
    gen = torch.Generator(device="cuda").manual_seed(s + 7 * t)
    if order == "sorted":
        qd = torch.cumsum((torch.rand(2, s, device="cuda", generator=gen) < 0.002).int(), 1)
        kd = torch.cumsum((torch.rand(2, t, device="cuda", generator=gen) < 0.002).int(), 1)
    elif order == "random":
        qd = torch.randint(0, 3, (2, s), device="cuda", generator=gen)
        kd = torch.randint(0, 3, (2, t), device="cuda", generator=gen)
    else:
        qd = (torch.arange(s, device="cuda") // 128 % 3).expand(2, s)
        kd = (torch.arange(t, device="cuda") // 128 % 3).expand(2, t)
    o, lse = kgen.attention(q, k, v, is_causal=causal, mask_mod="qd[row] == kd[col]",
                            vectors={"qd": qd, "kd": kd}, return_lse=True)
    torch.cuda.synchronize()
    same = qd[:, None, :, None] == kd[:, None, None, :]
    ref_o, ref_lse = reference(q, k, v, 1 / math.sqrt(128), causal=causal,
                               keep=lambda *a: same)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")


def test_bad_masks_and_vectors_are_argument_errors():
    torch = cuda_torch()
    from kgen.errors import ArgumentError

    q, k, v = _inputs(torch, 2, 4, 4, 64, 80, 64, 64, torch.bfloat16, seed=1)
    with pytest.raises(ArgumentError, match="does not broadcast"):
        kgen.attention(q, k, v, torch.zeros(2, 4, 64, 81, device="cuda", dtype=torch.bool))
    with pytest.raises(ArgumentError, match="must be bool"):
        kgen.attention(q, k, v, torch.zeros(64, 80, device="cuda"))
    with pytest.raises(ArgumentError, match=r"it must be \[H\] = \[4\]"):
        kgen.attention(q, k, v, score_mod="score * w[head]",
                       vectors={"w": torch.ones(3, device="cuda")})


# ---------------------------------------------------------------------------------------------
# Dropout: Philox keyed by (seed, offset), 16 bits an element, the kernel's mask the
# reference's bit for bit


def test_random_row_kernel_is_the_reference_philox_bit_for_bit():
    """random(seed, offset) in a row kernel stored as f32: every bit as the reference's."""
    torch = cuda_torch()
    import numpy as np

    from kgen.api import build
    from kgen.parse import parse
    from kgen.reference_tiles import random_uniform

    text = """kernel rng {
  target sm_80
  tensor X : f32[B, H, S, 64] row
  tensor U : f32[B, H, S, 64] row out
  scalar seed : u64
  scalar offset : u64
  epilogue {
    U = random(seed, offset) + 0 * X
  }
}
"""
    run = load_built(build(parse(text, "rng.kg").kernels[0], "sm_80"))
    x = torch.zeros(2, 3, 1000, 64, device="cuda")
    seed, offset = 2**63 + 12345, 2**33 + 8
    u = run(X=x, seed=seed - 2**64, offset=offset)
    torch.cuda.synchronize()
    got = u.cpu().numpy()
    for b in range(2):
        for h in range(3):
            want = random_uniform(seed, offset, b, h, 3, np.arange(1000), np.arange(64))
            assert np.array_equal(got[b, h], want.astype(np.float32)), (b, h)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_random_in_a_loop_is_the_reference_philox(arch):
    """rowsum(random(seed, offset)) over a ragged loop (tests/targets/test_loop_mods.py
    ROW_SUM_OF_RANDOM: the values drawn by a statement of their own, eight a Philox call):
    the reference's values summed over the existing keys."""
    torch = cuda_torch()
    import numpy as np

    from kgen.api import build
    from kgen.parse import parse
    from kgen.reference_tiles import random_uniform
    from tests.targets.test_loop_mods import ROW_SUM_OF_RANDOM

    if arch == "sm_90a" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("sm_90a needs Hopper")
    text = ROW_SUM_OF_RANDOM.replace("target sm_80", f"target {arch}")
    run = load_built(build(parse(text, "r.kg").kernels[0], arch))
    b, h, s, t = 2, 3, 77, 1000
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(b, h, s, 64, generator=gen).cuda().bfloat16()
    k, v = (torch.randn(b, h, t, 64, generator=gen).cuda().bfloat16() for _ in range(2))
    seed, offset = 2**63 + 77, 2**34 + 5
    _, u = run(Q=q, K=k, V=v, seed=seed - 2**64, offset=offset)  # (O, U): declaration order
    torch.cuda.synchronize()
    got = u.cpu().numpy()
    for bi in range(b):
        for hi in range(h):
            want = random_uniform(seed, offset, bi, hi, h, np.arange(s), np.arange(t)).sum(1)
            assert np.abs(got[bi, hi] - want).max() < 1e-3 * t, (bi, hi)
    assert not np.isnan(got).any()


def _dropout_reference(q, k, v, scale, drop, rng, causal):
    """O in float64 with the reference's Philox mask (numpy, per batch and head)."""
    torch = cuda_torch()
    import numpy as np

    from kgen.reference_tiles import random_uniform

    b, h, s, t = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    keep = np.stack([np.stack([random_uniform(rng[0], rng[1], bi, hi, h, np.arange(s),
                                              np.arange(t)) >= np.float32(drop)
                               for hi in range(h)]) for bi in range(b)])
    keep = torch.from_numpy(keep).to(q.device)
    group = h // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    x = scale * (q.double() @ kk.transpose(-1, -2))
    row = torch.arange(s, device=q.device)[:, None]
    col = torch.arange(t, device=q.device)[None, :]
    if causal:
        x = torch.where(col <= row, x, -math.inf)
    p = torch.exp(x - x.amax(-1, keepdim=True))
    o = (torch.where(keep, p / (1 - drop), 0.0) @ vv) / p.sum(-1, keepdim=True)
    return o, keep


@pytest.mark.parametrize("s, t, causal", [(1000, 1000, True), (17, 4097, False)])
def test_dropout_matches_the_reference_mask_and_reproduces(arch, s, t, causal):
    torch = cuda_torch()
    q, k, v = _inputs(torch, 2, 4, 2, s, t, 128, 128, torch.bfloat16, seed=s * 3 + t)
    torch.manual_seed(1234)
    o, rng = kgen.attention(q, k, v, is_causal=causal, enable_gqa=True, dropout_p=0.2,
                            return_rng=True)
    torch.cuda.synchronize()
    ref_o, keep = _dropout_reference(q, k, v, 1 / math.sqrt(128), 0.2, rng, causal)
    close(o, ref_o, 2e-2, f"O {arch}")
    # the same seed and offset give the same output; torch.manual_seed gives the same draw
    again = kgen.attention(q, k, v, is_causal=causal, enable_gqa=True, dropout_p=0.2,
                           dropout_rng=rng)
    torch.manual_seed(1234)
    drawn, rng2 = kgen.attention(q, k, v, is_causal=causal, enable_gqa=True, dropout_p=0.2,
                                 return_rng=True)
    torch.cuda.synchronize()
    assert rng2 == rng and torch.equal(again, o) and torch.equal(drawn, o)
    # the next call draws the next offset: another mask
    other, rng3 = kgen.attention(q, k, v, is_causal=causal, enable_gqa=True, dropout_p=0.2,
                                 return_rng=True)
    assert rng3 != rng and not torch.equal(other, o)


def test_dropout_keeps_one_minus_p(arch):
    """q = 0, V = 1: O = kept / (T (1 - p)) per row, so the kernel's kept fraction is
    mean(O) (1 - p)."""
    torch = cuda_torch()
    b, h, s, t, drop = 2, 4, 1000, 4096, 0.3
    q = torch.zeros(b, h, s, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, h, t, 128, device="cuda").to(torch.bfloat16)
    v = torch.ones(b, h, t, 128, device="cuda", dtype=torch.bfloat16)
    o = kgen.attention(q, k, v, dropout_p=drop, dropout_rng=(99, 4))
    torch.cuda.synchronize()
    kept = (o.double().mean() * (1 - drop)).item()
    assert abs(kept - (1 - drop)) < 0.003, kept


def test_bad_dropout_arguments():
    torch = cuda_torch()
    from kgen.errors import ArgumentError

    q, k, v = _inputs(torch, 1, 2, 2, 64, 64, 64, 64, torch.bfloat16, seed=2)
    with pytest.raises(ArgumentError, match=r"dropout_p must be a number in \[0, 1\)"):
        kgen.attention(q, k, v, dropout_p=1.0)
    with pytest.raises(ArgumentError, match="dropout_rng's seed must be an int"):
        kgen.attention(q, k, v, dropout_p=0.1, dropout_rng=(-1, 0))


def test_torch_compile_fullgraph_matches_eager():
    """torch.compile(fullgraph=True) of `kgen.attention(...)` (no break: the forward op,
    kgen/attention_traced.py) gives the eager call's O and lse bit for bit (the same kernel),
    causal with GQA and a softcap score_mod with its scalar; O and lse also against float64."""
    torch = cuda_torch()

    def call(q, k, v):
        return kgen.attention(q, k, v, is_causal=True, enable_gqa=True, return_lse=True,
                              score_mod="cap * tanh(score / cap)", scalars={"cap": 20.0})

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True)
    q, k, v = _inputs(torch, 2, 4, 2, 200, 170, 64, 64, torch.bfloat16, seed=21)
    want_o, want_lse = call(q, k, v)
    got_o, got_lse = compiled(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(got_o, want_o) and torch.equal(got_lse, want_lse)
    ref_o, ref_lse = reference(q, k, v, 0.125, causal=True, cap=20.0)
    close(got_o, ref_o, 2e-2, "O compiled")
    close(got_lse, ref_lse, 1e-3, "lse compiled")


def test_torch_compile_fullgraph_takes_every_forward_option():
    """torch.compile(fullgraph=True) with an additive bias, ALiBi's vectors, a dropout given its
    rng and FlexAttention's BlockMask (kgen/attention_traced.py: the forward op's arguments)
    gives the eager call's O and lse bit for bit."""
    torch = cuda_torch()
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v = _inputs(torch, 2, 4, 4, 384, 384, 64, 64, torch.bfloat16, seed=22)
    gen = torch.Generator(device="cuda").manual_seed(23)
    bias = torch.randn(384, 384, device="cuda", generator=gen).bfloat16()
    slopes = torch.rand(4, device="cuda", generator=gen)
    blocks = create_block_mask(lambda b, h, i, j: (i // 128 + j // 128) % 3 != 1, None, None,
                               384, 384, device="cuda")

    def call(q, k, v, bias, slopes, blocks):
        return kgen.attention(q, k, v, bias, score_mod="score - slopes[head] * (row - col)",
                              vectors={"slopes": slopes}, dropout_p=0.1,
                              dropout_rng=(5, 8), block_mask=blocks, return_lse=True)

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True)
    want_o, want_lse = call(q, k, v, bias, slopes, blocks)
    got_o, got_lse = compiled(q, k, v, bias, slopes, blocks)
    torch.cuda.synchronize()
    assert torch.equal(got_o, want_o) and torch.equal(got_lse, want_lse)
