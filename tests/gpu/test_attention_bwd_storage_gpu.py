"""On a GPU: the backward's mma.sync skeleton with its shared memory placed by kgen's storage
planner where the planner shares bytes (one ring slot: dS^T written over dO's slot, behind a
barrier; kgen/lower/loop_dag_storage.py). examples/attention_bwd_storage.kg (the seed's sm_80
configuration: f16, head dim 64, 64x64, 4 warps, 33,280 B) as written and causal, and the
head-dim-128 program with one slot, against float64 autograd of a reference attention at
ragged lengths, every output poisoned first (tests/gpu/attention_bwd_checks.py's check)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build_verified, load_built
from kgen.parse import parse
from kgen.verify import verify
from tests.gpu.attention_bwd_checks import MASKED, check_backward, kernel_text
from tests.gpu.attention_checks import cuda_torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "attention_bwd_storage.kg"
PLAIN = "exp(scale * acc - lse[col])"

_LOADED: dict = {}


def load(text: str):
    if text not in _LOADED:
        module = parse(text, "bwd.kg")
        assert verify(module) == []
        built = build_verified(module.kernels[0], ir.Arch.SM80)
        plan = built.plan
        assert plan.stages == 1 and plan.fenced, "the planner shares dO's bytes with dS^T"
        _LOADED[text] = load_built(built)
    return _LOADED[text]


def example_text(causal: bool) -> str:
    text = EXAMPLE.read_text()
    assert text.count(PLAIN) == 1
    return text.replace(PLAIN, MASKED) if causal else text


def run(text, d, s, t, dtype, mask, b=2, h=3):
    torch = cuda_torch()
    kernel = load(text)
    tdtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(7 * s + t + d)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", generator=gen).to(tdtype)
                   for n in (s, t, t, s))
    check_backward(kernel, q, k, v, do, mask)


SHAPES = [(1, 1), (17, 17), (1, 17), (17, 1000), (1000, 17), (1000, 1000), (4097, 1000),
          (1000, 4097)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_the_seed_configuration_matches_float64_autograd(causal, shape):
    run(example_text(causal), 64, *shape, "f16", "top_left" if causal else "none")


@pytest.mark.parametrize("mask", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("shape", [(17, 1000), (1000, 17), (4097, 1000)],
                         ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_one_slot_at_head_dim_128(mask, shape):
    text = kernel_text(128, mask, "bf16", "sm_80", "128x32  stages 1")
    run(text, 128, *shape, "bf16", mask)


@pytest.mark.parametrize("sizes", [{"B": 1, "H": 2, "S": 1000, "T": 777},
                                   {"B": 2, "H": 3, "S": 17, "T": 4097}],
                         ids=["s1000-t777", "s17-t4097"])
def test_kgen_run_of_the_example_checks(sizes):
    """`kgen run examples/attention_bwd_storage.kg` through the harness
    (kgen/harness/attention_bwd.py): every output against the float64 reference."""
    import json

    from kgen.api import build_file
    from kgen.harness.run import run as harness_run
    from kgen.runtime.device import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA GPU")
    built = build_file(EXAMPLE)
    report = harness_run(built.kernel, built.plan, built.source, sizes, check=True)
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    assert {c.name for c in report.checks} == {"dQ", "dK", "dV"}
