"""FP8 outputs with amax (examples/gemm_fp8_out_amax.kg): verify takes an FP8 tensor output of
an FP8 gemm, the reference rounds it once and saturates it to the format's finite range, and
the sm_90a kernel stores saturating pairs (bytes in the narrow entry point) beside the amax
reduction."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kgen import ir

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gemm_fp8_out_amax.kg"


@pytest.mark.parametrize("dtype, top", [(ir.DType.F8E4M3, 448.0), (ir.DType.F8E5M2, 57344.0)])
def test_the_reference_saturates_fp8_to_its_finite_range(dtype, top):
    from kgen.reference import round_to

    got = round_to(np.array([1e6, -1e6, top * 1.01, 1.0625, np.nan]), dtype)
    assert got[:3].tolist() == [top, -top, top]
    assert got[3] in (1.0, 1.125) and np.isnan(got[4])


def test_the_reference_stores_y_and_amax():
    from kgen.api import build_file
    from kgen.harness.inputs import make_inputs
    from kgen.reference import evaluate, round_to

    kernel = build_file(EXAMPLE).kernel
    inputs = make_inputs(kernel, dict(M=40, N=64, K=256), np.random.default_rng(2))
    out = evaluate(kernel, inputs, {"scale_out": 300.0})
    a, b = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
    d = (a @ b) * inputs["sa"].astype(np.float64)[:, None] * inputs["sb"].astype(np.float64)
    assert out["Y"].dtype.name == "float8_e4m3fn"
    assert np.array_equal(out["Y"].astype(np.float64),
                          round_to(d * np.float64(np.float32(300.0)), ir.DType.F8E4M3))
    assert (np.abs(out["Y"].astype(np.float64)) == 448.0).any()  # some saturate
    assert np.isclose(float(out["amax"].reshape(-1)[0]), np.abs(d).max(), rtol=1e-6)


def test_the_kernel_stores_saturating_pairs_and_reduces_amax():
    from kgen.api import build_file
    from kgen.plan import StorePath

    built = build_file(EXAMPLE)
    gs = built.plan.schedule.gemms[0]
    assert gs.output.path is StorePath.PAIRS and built.plan.init_kernel == "gemm_fp8_out_amax_init"
    source = built.source
    assert "store_pair<kNarrow>(p.Y + row * p.ld_Y + col, __nv_fp8x2_e4m3(make_float2(" in source
    assert "store_pair_bytes<kNarrow>(at, pair.__x, both);" in source
    assert "absmax over the tile into amax" in source


def test_the_16_bit_kernels_do_not_carry_the_fp8_pair_stores():
    from kgen.api import build_file

    root = EXAMPLE.parent
    for name in ("gemm_fp8_rowwise.kg", "gemm_fp8_blockwise.kg"):
        assert "store_pair_bytes" not in build_file(root / name).source


def test_an_fp8_output_is_never_added_into():
    from kgen.errors import KgenError
    from kgen.parse import parse
    from kgen.verify import verify

    text = EXAMPLE.read_text().replace("tensor Y : f8e4m3[M, N] row out",
                                       "tensor Y : f8e4m3[M, N] row out accumulate")
    with pytest.raises(KgenError):
        verify(parse(text, "f.kg"))
