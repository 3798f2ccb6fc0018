"""On a GPU: reductions in both modes against the reference, and the deterministic mode's
results bit-identical from run to run."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
REDUCING = ["evt_softmax_stats.kg", "evt_colsum.kg"]


def _kernel(name, deterministic):
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / name).kernels[0]
    return dataclasses.replace(kernel, deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mnk", [(130, 258, 72), (1000, 1000, 40), (2100, 1030, 264)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", REDUCING)
def test_reductions_match_reference(name, mnk, deterministic):
    from kgen.api import build
    from kgen.harness.run import run

    built = build(_kernel(name, deterministic))
    report = run(built.kernel, built.plan, built.source, dict(zip("MNK", mnk)), check=True)
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)


def test_deterministic_mode_is_bit_identical():
    import torch

    import kgen

    k = kgen.load(_kernel("evt_colsum.kg", True))
    torch.manual_seed(3)
    M, N, K = 3000, 1000, 512
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()  # K x N, column-major
    results = []
    for _ in range(3):
        g = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        dbias = torch.full((N,), float("nan"), device="cuda")
        gmax = torch.full((N,), float("nan"), device="cuda")
        total = torch.full((), float("nan"), device="cuda")
        k(A=a, B=b, G=g, dbias=dbias, gmax=gmax, total=total)
        torch.cuda.synchronize()
        results.append([t.cpu().numpy().copy() for t in (dbias, gmax, total)])
    for other in results[1:]:
        for x, y in zip(results[0], other):
            assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
    ref = (a.float() @ b.float()).sum(0).cpu().numpy()
    assert np.allclose(results[0][0], ref, rtol=1e-3, atol=1e-2)
