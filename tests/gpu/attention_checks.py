"""What the attention GPU tests share: torch with a CUDA device (else the test skips), a skip
where the GPU does not run a target's code, the comparison of a kernel's output with a float64
reference (NaN-free, the same infinities, the finite elements within `tol` of the reference's
magnitude; close_grads for dQ, dK and dV), and the float64 reference of attention over packed
sequences (kgen.attention_varlen's forward and, through autograd, its backward)."""
from __future__ import annotations

import math

import pytest


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def skip_unless_runs(arch: str) -> None:
    """Skips the test where this GPU cannot run `arch`'s code (sm_90a: compute capability 9.0
    only; sm_80's runs on any the tests use)."""
    torch = cuda_torch()
    if arch == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def close(out, ref, tol, what):
    torch = cuda_torch()
    out = out.double()
    assert not torch.isnan(out).any(), f"{what}: NaN"
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf), f"{what}: infinities differ"
    finite = ~inf
    if finite.any():
        err = (out[finite] - ref[finite]).abs().max().item()
        scale = max(1.0, ref[finite].abs().max().item())
        assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def close_grads(got, want, tol):
    """dQ, dK and dV, each of its reference's shape and close to it."""
    for name, have, ref in zip(("dQ", "dK", "dV"), got, want):
        assert have.shape == ref.shape, f"{name}: shape {tuple(have.shape)}, not {tuple(ref.shape)}"
        close(have, ref, tol, name)


def varlen_reference(q, k, v, cu_q, cu_k, scale, causal):
    """O [total_q, H, D_v] and lse [H, total_q] in float64 of packed q [total_q, H, D], k and v
    [total_k, HKV, D] (GQA: each KV head serves H / HKV query heads), sequence by sequence
    (the offsets cu_q, cu_k as lists; causal: bottom-right within each sequence). A row that
    sees no key gives O = 0 and lse = -inf. Differentiable in q, k and v where they require
    grad (float64 leaves): such a row gets no gradient."""
    torch = cuda_torch()
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        qb = q[sq].double().transpose(0, 1)
        kb = k[sk].double().transpose(0, 1).repeat_interleave(group, dim=0)
        vb = v[sk].double().transpose(0, 1).repeat_interleave(group, dim=0)
        x = scale * (qb @ kb.transpose(-1, -2))
        s, t = x.shape[-2:]
        if causal:
            row = torch.arange(s, device=q.device)[:, None]
            col = torch.arange(t, device=q.device)[None, :]
            x = torch.where(col <= row + t - s, x, -math.inf)
        m = (x.detach().amax(-1) if t else
             torch.full(x.shape[:-1], -math.inf, dtype=torch.float64, device=q.device))
        p = torch.exp(x - torch.where(m == -math.inf, 0.0, m)[..., None])
        total = p.sum(-1)
        # a row of no key: total 0, p @ vb 0; divided by 1, not 0 (no NaN in the gradient)
        o = (p @ vb) / torch.where(total == 0, 1.0, total)[..., None]
        outs.append(o.transpose(0, 1))
        lses.append(torch.where(total == 0, -math.inf, m + torch.log(total)))
    return torch.cat(outs), torch.cat(lses, dim=1)
