"""On a GPU: the attention backward's GQA / MQA and deterministic mode (tests/test_backward_gqa.py
has the CPU side). The main kernel (examples/attention_bwd.kg with K, V, dK, dV of HKV heads,
and/or `reductions deterministic`) against float64 torch autograd of a reference attention whose
K and V are shared by the query heads of a group (dK, dV summed over it): ratios 2:1, 8:1 and
MQA, ragged S and T, no mask and causal (top-left, bottom-right), on the sm_80 build (mma.sync,
tile 128x32) and the sm_90a build (the wgmma skeleton; its dQ by tensor reduce-adds from the add
warp or from each warpgroup, by bulk reduce-adds per row or by atomics)
on a Hopper GPU. Deterministic: two runs give the same bits. kgen.attention trains with GQA and
`deterministic=True`."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build_verified, load_built
from kgen.parse import parse
from kgen.verify import verify
from tests.gpu.attention_checks import close, cuda_torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "examples" / "attention_bwd.kg").read_text()
MASKED = "where(row <= col, exp(scale * acc - lse[col]), 0)"
MASKS = {"none": "exp(scale * acc - lse[col])", "top_left": MASKED,
         "bottom_right": "where(row <= col + T - S, exp(scale * acc - lse[col]), 0)"}


def kernel_text(d, mask, arch, gqa: bool, deterministic: bool) -> str:
    text = (TEXT.replace(MASKED, MASKS[mask]).replace("128]", f"{d}]")
            .replace("target sm_80", f"target {arch}")
            .replace("0.08838834764", repr(1.0 / math.sqrt(d))))
    if arch == "sm_90a":  # the rulebook's wgmma skeleton
        text = text.replace("    tile 128x32\n", "")
    if gqa:
        for name in ("K", "V", "dK", "dV"):
            text = text.replace(f"tensor {name} : bf16[B, H,", f"tensor {name} : bf16[B, HKV,")
    if deterministic:
        text = text.replace("kernel attention_bwd {\n",
                            "kernel attention_bwd {\n  reductions deterministic\n")
    return text


_LOADED: dict = {}


def load(d, mask, arch="sm_80", gqa=True, deterministic=False, adds=None):
    key = (d, mask, arch, gqa, deterministic, adds)
    if key not in _LOADED:
        module = parse(kernel_text(d, mask, arch, gqa, deterministic), "bwd.kg")
        assert verify(module) == []
        built = build_verified(module.kernels[0], ir.Arch(arch))
        assert built.plan.gqa == gqa and (built.plan.deterministic is not None) == deterministic
        if adds is not None:
            import dataclasses

            from kgen.targets.sm90.loop_dag import emit
            from kgen.targets.sm90.loop_dag_schedule import with_adds

            plan = with_adds(built.plan, adds)
            built = dataclasses.replace(built, plan=plan, source=emit(
                plan, source_name="bwd.kg", source_hash="0", command="test"))
        _LOADED[key] = load_built(built)
    return _LOADED[key]


def _hopper():
    torch = cuda_torch()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def reference(q, k, v, do, scale, mask):
    """float64 autograd of attention with K, V shared by each group of q's heads; a row that
    sees no key gives no gradient. dQ, dK, dV, lse, D."""
    torch = cuda_torch()
    group = q.shape[1] // k.shape[1]
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    kr, vr = (x.repeat_interleave(group, 1) for x in (k, v))
    s_len, t_len = q.shape[-2], k.shape[-2]
    x = (q @ kr.transpose(-1, -2)) * scale
    query = torch.arange(s_len, device=q.device)[:, None]
    key = torch.arange(t_len, device=q.device)[None, :]
    if mask == "top_left":
        x = torch.where(key <= query, x, -math.inf)
    elif mask == "bottom_right":
        x = torch.where(key <= query + t_len - s_len, x, -math.inf)
    m = x.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), 0.0, m)
    e = torch.exp(x - m)
    total = e.sum(-1, keepdim=True)
    o = (e / torch.where(total == 0, 1.0, total)) @ vr
    o.backward(do.double())
    with torch.no_grad():
        lse = torch.where(total == 0, -math.inf, m + torch.log(total)).squeeze(-1)
        dd = (do.double() * o).sum(-1)
    return q.grad, k.grad, v.grad, lse, dd


def run_case(d, s, t, mask, heads, kv_heads, arch="sm_80", deterministic=False, adds=None,
             b=2, repeat=1, gqa=True):
    torch = cuda_torch()
    kernel = load(d, mask, arch, gqa, deterministic, adds)
    gen = torch.Generator(device="cuda").manual_seed(1000 * s + t + d + heads)
    q, do = (torch.randn(b, heads, s, d, device="cuda", generator=gen).bfloat16()
             for _ in range(2))
    k, v = (torch.randn(b, kv_heads, t, d, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    scale = 1.0 / math.sqrt(d)
    dq_ref, dk_ref, dv_ref, lse, dd = reference(q, k, v, do, scale, mask)
    runs = []
    for _ in range(repeat):
        dq = torch.full((b, heads, s, d), math.nan, device="cuda")
        dk = torch.full((b, kv_heads, t, d), math.nan, device="cuda", dtype=torch.bfloat16)
        dv = torch.full((b, kv_heads, t, d), math.nan, device="cuda", dtype=torch.bfloat16)
        kernel(Q=q, K=k, V=v, dO=do, lse=lse.float(), D=dd.float(), dQ=dq, dK=dk, dV=dv,
               scale=scale)
        torch.cuda.synchronize()
        close(dv, dv_ref, 2e-2, "dV")
        close(dk, dk_ref, 2e-2, "dK")
        close(dq, dq_ref, 2e-2, "dQ")
        runs.append((dq, dk, dv))
    return runs


RATIOS = [(4, 2), (8, 1), (16, 2)]  # 2:1, MQA, 8:1
SHAPES = [(1, 17), (17, 1000), (1000, 17), (1000, 4097), (4097, 1000)]


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"h{r[0]}-hkv{r[1]}")
def test_gqa_sm80(mask, shape, ratio):
    run_case(128, *shape, mask, *ratio, b=1)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"h{r[0]}-hkv{r[1]}")
def test_gqa_sm90a_wgmma(mask, shape, ratio):
    _hopper()
    run_case(128, *shape, mask, *ratio, arch="sm_90a", b=1)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gqa_head_dim_64_and_batches(arch):
    if arch == "sm_90a":
        _hopper()
    run_case(64, 333, 1000, "top_left", 6, 2, arch=arch, b=3)
    run_case(64, 1000, 333, "bottom_right", 3, 1, arch=arch, b=2)


@pytest.mark.parametrize("adds", ["tensor", "rows", "atomics"])
def test_gqa_sm90a_other_adds(adds):
    _hopper()
    run_case(128, 1000, 4097, "top_left", 8, 2, arch="sm_90a", adds=adds, b=1)


DET = [("sm_80", None), ("sm_90a", None), ("sm_90a", "rows"), ("sm_90a", "atomics")]


@pytest.mark.parametrize("arch, adds", DET,
                         ids=["sm80", "sm90a-warp", "sm90a-rows", "sm90a-atomics"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_deterministic_runs_give_the_same_bits(arch, adds, mask, gqa):
    torch = cuda_torch()
    if arch == "sm_90a":
        _hopper()
    heads, kv = (4, 2) if gqa else (3, 3)
    for s, t in ((1000, 4097), (4097, 1000), (17, 1)):
        runs = run_case(128, s, t, mask, heads, kv, arch=arch, deterministic=True, adds=adds,
                        b=1, repeat=3, gqa=gqa)
        for other in runs[1:]:
            for a, b, what in zip(runs[0], other, ("dQ", "dK", "dV")):
                assert torch.equal(a, b), f"{what} differs between runs (S {s}, T {t})"


# ---------------------------------------------------------------------------------------------
# kgen.attention trains with GQA, and deterministically on request


def _inputs(torch, seed, b, h, hkv, s, t, d):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(b, hkv, t, d, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    return q, k, v, do


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", [(17, 17), (1000, 1000), (17, 1000), (1, 1)])
def test_kgen_attention_gqa_gradients(s, t, causal):
    torch = cuda_torch()
    import kgen

    q, k, v, do = _inputs(torch, s + t, 2, 8, 2, s, t, 64)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = kgen.attention(q, k, v, is_causal=causal, enable_gqa=True)
    out.backward(do)
    torch.cuda.synchronize()
    dq, dk, dv, _, _ = reference(q.detach(), k.detach(), v.detach(), do, 1 / 8,
                                 "top_left" if causal else "none")
    close(q.grad, dq, 3e-2, "dQ")
    close(k.grad, dk, 3e-2, "dK")
    close(v.grad, dv, 3e-2, "dV")


@pytest.mark.parametrize("how", ["argument", "torch_flag"])
def test_kgen_attention_deterministic(how):
    torch = cuda_torch()
    import kgen

    q, k, v, do = _inputs(torch, 7, 1, 4, 2, 2000, 2000, 64)
    grads = []
    for _ in range(3):
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        if how == "argument":
            out = kgen.attention(qq, kk, vv, is_causal=True, enable_gqa=True,
                                 deterministic=True)
        else:
            previous = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(True, warn_only=True)
            try:
                out = kgen.attention(qq, kk, vv, is_causal=True, enable_gqa=True)
            finally:
                torch.use_deterministic_algorithms(previous)
        out.backward(do)
        grads.append((qq.grad, kk.grad, vv.grad))
    torch.cuda.synchronize()
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.equal(a, b)
    dq, dk, dv, _, _ = reference(q, k, v, do, 1 / 8, "top_left")
    close(grads[0][0], dq, 3e-2, "dQ")
    close(grads[0][1], dk, 3e-2, "dK")
    close(grads[0][2], dv, 3e-2, "dV")
