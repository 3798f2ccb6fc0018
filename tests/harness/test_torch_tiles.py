"""The PyTorch baseline of tile programs (kgen/harness/torch_eval.py) against the NumPy reference
with one block, on the CPU."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kgen import ir
from kgen.parse import parse_file
from kgen.reference import compare, evaluate

torch = pytest.importorskip("torch")

PROGRAMS = Path(__file__).resolve().parent.parent.parent / "examples"


def _torch(arrays):
    return {name: torch.from_numpy(np.asarray(a, dtype=np.float32)).to(
        torch.bfloat16 if a.dtype == ml_dtypes.bfloat16 else torch.float32)
        for name, a in arrays.items()}


def test_attention_baseline_matches_the_reference():
    from kgen.harness.torch_eval import TorchEvaluator

    kernel = parse_file(PROGRAMS / "attention_fwd.kg").kernels[0]
    rng = np.random.default_rng(0)
    arrays = {"Q": rng.standard_normal((2, 4, 33, 128)).astype(ml_dtypes.bfloat16),
              "K": rng.standard_normal((2, 2, 50, 128)).astype(ml_dtypes.bfloat16),
              "V": rng.standard_normal((2, 2, 50, 128)).astype(ml_dtypes.bfloat16)}
    got = TorchEvaluator(kernel, _torch(arrays), {}).run()
    want = evaluate(kernel, arrays, block=50)
    assert got["O"].shape == (2, 4, 33, 128) and got["lse"].shape == (2, 4, 33)
    o = got["O"].float().numpy()
    assert compare(o, want["O"], ir.DType.BF16, atol=3e-2, rtol=3e-2).ok
    assert compare(got["lse"].numpy(), want["lse"], ir.DType.F32, atol=2e-2, rtol=2e-2).ok


def test_row_kernel_and_mlp_baselines_match_the_reference():
    from kgen.harness.torch_eval import TorchEvaluator

    rng = np.random.default_rng(1)
    row = parse_file(PROGRAMS / "attention_bwd_dot.kg").kernels[0]
    arrays = {"dO": rng.standard_normal((1, 2, 17, 128)).astype(ml_dtypes.bfloat16),
              "O": rng.standard_normal((1, 2, 17, 128)).astype(ml_dtypes.bfloat16)}
    got = TorchEvaluator(row, _torch(arrays), {}).run()["D"].numpy()
    assert compare(got, evaluate(row, arrays)["D"], ir.DType.F32, rtol=1e-4, atol=1e-4).ok
    mlp = parse_file(PROGRAMS / "mlp_loop.kg").kernels[0]
    arrays = {"X": rng.standard_normal((17, 256)).astype(ml_dtypes.bfloat16),
              "W0": (rng.standard_normal((256, 100)) / 16).astype(ml_dtypes.bfloat16),
              "W1": (rng.standard_normal((100, 128)) / 16).astype(ml_dtypes.bfloat16),
              "b0": rng.standard_normal(100).astype(np.float32)}
    got = TorchEvaluator(mlp, _torch(arrays), {}).run()["Y"].float().numpy()
    assert compare(got, evaluate(mlp, arrays, block=100)["Y"], ir.DType.BF16).ok


def test_sizes_as_values_in_the_torch_baseline():
    """The windowed example (col <= row + T - S, a window): sizes read from the inputs."""
    from kgen.harness.torch_eval import TorchEvaluator

    kernel = parse_file(PROGRAMS / "attention_fwd_window.kg").kernels[0]
    rng = np.random.default_rng(5)
    arrays = {"Q": rng.standard_normal((1, 2, 70, 128)).astype(ml_dtypes.bfloat16),
              "K": rng.standard_normal((1, 1, 40, 128)).astype(ml_dtypes.bfloat16),
              "V": rng.standard_normal((1, 1, 40, 128)).astype(ml_dtypes.bfloat16)}
    scalars = {"window": 9.0}
    got = TorchEvaluator(kernel, _torch(arrays), scalars).run()
    want = evaluate(kernel, arrays, scalars=scalars, block=40)
    assert np.isneginf(want["lse"][0, :, :30]).all()  # rows before T - S keep no key
    assert compare(got["O"].float().numpy(), want["O"], ir.DType.BF16, atol=3e-2, rtol=3e-2).ok
    assert compare(got["lse"].numpy(), want["lse"], ir.DType.F32, atol=2e-2, rtol=2e-2).ok


def test_attention_backward_baseline_matches_the_reference():
    """A DAG loop unfused: the five gemms over the whole loop, dQ's `+=` into zero."""
    from kgen.harness.torch_eval import TorchEvaluator

    kernel = parse_file(PROGRAMS / "attention_bwd.kg").kernels[0]
    rng = np.random.default_rng(4)
    arrays = {name: rng.standard_normal((1, 2, n, 128)).astype(ml_dtypes.bfloat16)
              for name, n in (("Q", 40), ("K", 24), ("V", 24), ("dO", 40))}
    arrays["lse"] = (rng.uniform(2.0, 3.0, (1, 2, 40))).astype(np.float32)
    arrays["D"] = rng.standard_normal((1, 2, 40)).astype(np.float32)
    got = TorchEvaluator(kernel, _torch(arrays), {"scale": 0.088}).run()
    want = evaluate(kernel, arrays, {"scale": 0.088}, block=40)
    assert {n: tuple(t.shape) for n, t in got.items()} == {
        "dQ": (1, 2, 40, 128), "dK": (1, 2, 24, 128), "dV": (1, 2, 24, 128)}
    for name in ("dQ", "dK", "dV"):
        ref = np.asarray(want[name], np.float64)
        out = got[name].float().numpy()
        scale = max(1.0, np.abs(ref).max())
        assert np.abs(out - ref).max() <= 2e-2 * scale, name
        assert np.abs(ref).max() > 0.05, name  # the check compares something
