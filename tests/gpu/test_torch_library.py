"""On a GPU: a kernel as a torch op, checked against PyTorch in float32, eagerly, under
torch.compile with fullgraph=True (a graph break raises), and replayed from a CUDA graph."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def op():
    import kgen

    return kgen.torch_op(kgen.load(EXAMPLES / "gemm_bias_relu.kg"), name="t_gemm_bias_relu")


def _inputs(m=1000, n=520, k=136, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(m, k, device="cuda", generator=g).half()
    B = torch.randn(n, k, device="cuda", generator=g).half().t()  # [K, N], col-major
    C = torch.randn(m, n, device="cuda", generator=g).half()
    bias = torch.randn(n, device="cuda", generator=g)
    return A, B, C, bias


def _reference(A, B, C, bias, alpha=1.5, beta=0.5):
    return torch.relu(alpha * (A.float() @ B.float()) + beta * C.float() + bias)


def _close(out, ref):
    err = (out.float() - ref).norm() / ref.norm()
    assert torch.isfinite(out.float()).all() and err < 2e-3, float(err)


def test_eager(op):
    args = _inputs()
    out = op(*args)
    assert out.shape == (1000, 520) and out.dtype == torch.float16
    _close(out, _reference(*args))
    _close(op(*args, alpha=0.25), _reference(*args, alpha=0.25))


def test_torch_compile_without_graph_break(op):
    def fused(A, B, C, bias):
        return op(A, B, C, bias) * 2.0

    compiled = torch.compile(fused, fullgraph=True)
    args = _inputs(seed=1)
    _close(compiled(*args), 2.0 * _reference(*args))


def test_cuda_graph_capture(op):
    args = _inputs(seed=2)
    op(*args)  # warm: module load and first-call work stay out of the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(*args)
    fresh = _inputs(seed=3)
    for dst, src in zip(args, fresh):
        dst.copy_(src)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _close(out, _reference(*fresh))


def test_load_allocates_missing_outputs():
    """kgen.load kernels allocate the outputs they are not given, and return them."""
    import kgen

    k = kgen.load(EXAMPLES / "evt_multi_output.kg")
    g = torch.Generator(device="cuda").manual_seed(4)
    A = torch.randn(300, 136, device="cuda", generator=g).half()
    B = torch.randn(264, 136, device="cuda", generator=g).half().t()
    bias = torch.randn(264, device="cuda", generator=g)
    shift = torch.randn(300, device="cuda", generator=g)
    Z, D = k(A=A, B=B, bias=bias, shift=shift)
    torch.cuda.synchronize()
    z = 1.25 * (A.float() @ B.float()) + bias - shift[:, None]
    _close(Z, z)
    _close(D, torch.nn.functional.gelu(-z) * z)
    assert Z.shape == D.shape == (300, 264) and Z.dtype == torch.float16
