"""What the attention GPU tests share: torch with a CUDA device (else the test skips), and the
comparison of a kernel's output with a float64 reference (NaN-free, the same infinities, the
finite elements within `tol` of the reference's magnitude)."""
from __future__ import annotations

import pytest


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


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
