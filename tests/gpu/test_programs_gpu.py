"""On a GPU: the tile programs of examples/ through `kgen run` (the check passes, --bench times
kgen and PyTorch) and through the gemms' call path (kgen.runtime.calls): a CUDA-graph capture
of attention (GQA, causal) replayed on new inputs, the binding kept per signature, torch's
current stream, outputs left out allocated."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUNS = [
    ("attention_fwd.kg", "B=2,H=8,HKV=1,S=1000,T=1000"),
    ("attention_fwd.kg", "B=1,H=4,HKV=2,S=17,T=4097"),
    ("mlp_loop.kg", "M=1000,N0=1000"),
    ("mlp_loop.kg", "M=17,N0=72"),
    ("attention_bwd_dot.kg", "B=2,H=8,S=1000"),
    ("attention_bwd_dot.kg", "B=1,H=1,S=1"),
]


def _needs(example: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if "target sm_90a" in (EXAMPLES / example).read_text() and (
            torch.cuda.get_device_capability() != (9, 0)):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _run(*args):
    from click.testing import CliRunner

    from kgen.cli import cli

    result = CliRunner().invoke(cli, ["run", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


@pytest.mark.parametrize("example, sizes", RUNS, ids=[f"{e[:-3]}-{s}" for e, s in RUNS])
def test_kgen_run_checks_each_program(example, sizes):
    _needs(example)
    data = _run(str(EXAMPLES / example), "--size", sizes)
    assert data["checked"] and data["ok"] is True, json.dumps(data["checks"], indent=1)
    assert data["checks"] and all(c["unwritten"] == 0 for c in data["checks"])
    given = dict(item.split("=") for item in sizes.split(","))
    assert data["sizes"] == {k: int(v) for k, v in given.items()}


@pytest.mark.parametrize("example", ["attention_fwd.kg", "mlp_loop.kg", "attention_bwd_dot.kg"])
def test_kgen_run_bench_times_kgen_and_torch(example):
    _needs(example)
    data = _run(str(EXAMPLES / example), "--bench", "--iters", "10")
    assert data["ok"] is True and data["time_ms"] > 0
    assert data["torch_time_ms"] and data["torch_time_ms"] > 0, data["notes"]
    assert data["gbps"] > 0 and (data["flops"] > 0) == (example != "attention_bwd_dot.kg")


def _attention_inputs(seed, b=2, h=8, hkv=2, s=300, t=257, d=128):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
    k = torch.randn(b, hkv, t, d, device="cuda", generator=gen).bfloat16()
    v = torch.randn(b, hkv, t, d, device="cuda", generator=gen).bfloat16()
    return q, k, v


def _reference(q, k, v, scale):
    from tests.gpu.test_loop_gpu import attention_reference

    return attention_reference(q, k, v, scale, causal=True)


def _close(out, ref, tol, what):
    from tests.gpu.test_loop_gpu import _close as close

    close(out, ref, tol, what)


@pytest.mark.parametrize("outputs", ["given", "allocated"])
def test_attention_captures_into_a_cuda_graph(outputs):
    """Captured on torch.cuda.graph's own stream (torch's current one inside the capture),
    replayed on new inputs with the outputs poisoned: the replay computes on them."""
    _needs("attention_fwd.kg")
    import kgen

    loaded = kgen.load(EXAMPLES / "attention_fwd.kg")
    scale = 0.08838834764
    q, k, v = _attention_inputs(1)
    given = {}
    if outputs == "given":
        given = {"O": torch.empty_like(q), "lse": torch.empty(q.shape[:3], device="cuda")}

    def call():
        return loaded(Q=q, K=k, V=v, **given)

    call()  # the signature's first call: checked and bound outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = call()
    assert len(loaded._calls._bindings) == 1  # the capture took the kept binding
    fresh = _attention_inputs(2)
    for old, new in zip((q, k, v), fresh):
        old.copy_(new)
    o.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_o, ref_lse = _reference(q, k, v, scale)
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")


def test_attention_runs_on_torchs_current_stream_at_the_cost_of_a_kept_binding():
    _needs("attention_fwd.kg")
    import kgen

    loaded = kgen.load(EXAMPLES / "attention_fwd.kg")
    q, k, v = _attention_inputs(3, s=64, t=64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o, lse = loaded(Q=q, K=k, V=v)
        o2, _ = loaded(Q=q.clone(), K=k, V=v)  # another address: the same binding
    side.synchronize()
    assert len(loaded._calls._bindings) == 1
    ref_o, _ = _reference(q, k, v, 0.08838834764)
    _close(o, ref_o, 2e-2, "O")
    assert torch.equal(o, o2)
    assert np.isfinite(lse.float().cpu().numpy()).all()
