"""How the warp-specialized epilogue spells its transcendental functions (EpilogueMath,
kgen/targets/sm90/epilogue_math.py): the rule and its why, the C++ of each spelling, gelu_phi's
accuracy against the float64 x Phi(x), the other targets left as written, and NVRTC's compile.
The GPU figures: bench/fused_llama.py."""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from kgen import ir
from kgen.emit import emit
from kgen.enums import Op
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import EpilogueMath
from kgen.reference import tolerance
from kgen.targets.common.epilogue_cpp import OP_CPP
from kgen.targets.sm90 import epilogue_math
from kgen.targets.sm90.epilogue_groups import GROUP_FROM, epilogue_groups
from kgen.targets.sm90.epilogue_math import GELU_CLAMP, GELU_Q, OPS


def _kernel(expr: str, target: str = "sm_90a", extra: str = "") -> ir.Kernel:
    text = f"""
kernel k {{
  target {target}
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  {extra}
  tensor D : bf16[M, N] row out
  gemm g = A @ B accumulate f32 {{
    epilogue {{ D = {expr} }}
  }}
}}
"""
    return parse(text, "k.kg").kernels[0]


def _plan(expr: str, **kw):
    return lower(_kernel(expr, **kw))


def _source(plan) -> str:
    return emit(plan, source_name="k.kg", source_hash="", command="test")


ACCURATE = re.compile(r"(?<![_\w])expf\(")  # expf( not preceded by __


@pytest.mark.parametrize("expr, extra, spelled", [
    ("silu(acc) * U", "tensor U : bf16[M, N] row", "silu"),
    ("sigmoid(acc)", "", "sigmoid"),
    ("exp(acc)", "", "exp"),
    ("gelu(acc)", "", None),
])
def test_the_exponentials_and_gelu_take_the_hardware_spellings(expr, extra, spelled):
    math_ = _plan(expr, extra=extra).schedule.gemms[0].math
    assert math_.intrinsics
    assert "tensor cores idle" in math_.why
    if spelled:
        assert f"{spelled} on the hardware's ex2 and reciprocal" in math_.why
        assert "gelu's Phi" not in math_.why
    else:
        assert "gelu's Phi as 2^-q(|x|)" in math_.why and "ex2 and reciprocal" not in math_.why


@pytest.mark.parametrize("expr, extra", [("acc", ""), ("acc + C", "tensor C : bf16[M, N] row"),
                                          ("relu(acc)", ""), ("tanh(acc)", "")])
def test_epilogues_without_them_are_spelled_as_written_and_say_nothing(expr, extra):
    plan = _plan(expr, extra=extra)
    assert plan.schedule.gemms[0].math == EpilogueMath()
    assert not any("epilogue math" in row[0] for row in plan.schedule.describe())


def test_inspect_shows_the_spelling():
    rows = [row for row in _plan("gelu(acc) + silu(acc)").schedule.describe()
            if row[0] == "g epilogue math"]
    assert rows == [("g epilogue math", "__expf, __fdividef",
                     epilogue_math.epilogue_math(lower(_kernel("gelu(acc) + silu(acc)")).gemms[0]).why)]
    assert "silu on the hardware's ex2" in rows[0][2] and "gelu's Phi" in rows[0][2]


def test_the_silu_gate_is_emitted_on_ex2_and_the_reciprocal():
    source = _source(_plan("silu(acc) * U", extra="tensor U : bf16[M, N] row"))
    assert "__fdividef(acc_0, 1.0f + __expf(-acc_0))" in source
    assert not ACCURATE.search(source)
    assert "gelu_phi" not in source  # the helper only where gelu is called


def test_gelu_calls_gelu_phi_and_carries_it():
    source = _source(_plan("gelu(acc)"))
    assert source.count("__device__ __forceinline__ float gelu_phi(float x)") == 1
    assert "gelu_phi(acc_0)" in source and "erff(" not in source
    horner = re.findall(r"q = fmaf\(q, u, (\S+)f\);", source)
    assert len(horner) == len(GELU_Q) - 1  # the highest power starts q


def test_a_plan_spelled_as_written_emits_expf_and_erff():
    plan = _plan("gelu(acc) + silu(acc)")
    plain = plan.with_gemm_schedule(math=EpilogueMath())
    source = _source(plain)
    assert "erff(" in source and ACCURATE.search(source) and "__expf" not in source
    assert "gelu_phi" not in source


def test_sm80_keeps_the_written_spelling():
    source = _source(_plan("silu(acc) * U", target="sm_80", extra="tensor U : bf16[M, N] row"))
    assert ACCURATE.search(source) and "__fdividef" not in source


def test_the_table_changes_only_the_respelled_ops():
    assert {op for op in OP_CPP if OPS[op] != OP_CPP[op]} == {Op.EXP, Op.SIGMOID, Op.SILU,
                                                             Op.GELU}
    assert epilogue_math.ops(EpilogueMath()) is OP_CPP
    assert epilogue_math.ops(EpilogueMath(True, "why")) is OPS


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def gelu_phi_f32(x: np.ndarray) -> np.ndarray:
    """gelu_phi in float32 as the template writes it: Horner with fused multiply-adds (exact
    products in float64, one rounding), ex2 in float64 rounded once, the select and product."""
    x = _f32(x)
    u = np.minimum(np.abs(x), np.float32(GELU_CLAMP))
    coefs = _f32(GELU_Q)
    q = np.full_like(u, coefs[-1])
    for c in coefs[-2::-1]:
        q = (q.astype(np.float64) * u + np.float64(c)).astype(np.float32)
    e = np.exp2(-q.astype(np.float64)).astype(np.float32)
    phi = np.where(x >= 0, (1.0 - 0.5 * e.astype(np.float64)).astype(np.float32),
                   (np.float32(0.5) * e).astype(np.float32))
    return (x.astype(np.float64) * phi).astype(np.float32)


def test_gelu_phi_is_within_a_few_f32_units_of_x_phi():
    x = np.concatenate([np.linspace(-8.0, 8.0, 32001), np.linspace(-200.0, 200.0, 4001),
                        [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    erfc = np.vectorize(math.erfc)
    ref = x.astype(np.float64) * 0.5 * erfc(-x.astype(np.float64) / math.sqrt(2.0))
    got = gelu_phi_f32(x).astype(np.float64)
    err = np.abs(got - ref)
    inner = np.abs(x) <= GELU_CLAMP
    assert (err[inner] / np.maximum(np.abs(ref[inner]), 1e-30)).max() < 4e-6
    assert err.max() < 5e-7  # past the clamp Phi(-6) = 1e-9 stands for the tail
    for dtype in (ir.DType.F32, ir.DType.F16, ir.DType.BF16):
        atol, rtol = tolerance(dtype)
        assert (err <= 1e-3 * (atol + rtol * np.abs(ref))).all()


def test_gelu_phi_keeps_nan_and_the_infinities():
    got = gelu_phi_f32(_f32([np.nan, np.inf, -np.inf]))
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf


def test_the_groups_weigh_the_spelling():
    plan = lower(_kernel("silu(acc) * sigmoid(acc) * exp(acc) + silu(acc + 1.0)"))
    g = plan.gemms[0]
    spelled = plan.schedule.gemms[0]
    assert spelled.math.intrinsics and spelled.groups.count == 1  # 4 + 4 + 2 + 4 < 35
    rolled, why = epilogue_groups(g, 1, spelled.output.path)  # as written: 14 + 14 + 12 + 14
    assert rolled == 4 and f"rolled from {GROUP_FROM}" in why
    gelu = lower(_kernel("gelu(acc)")).schedule.gemms[0]
    assert gelu.math.intrinsics and gelu.groups.count == 4  # gelu_phi's PTX weighs an erff's


@pytest.mark.parametrize("expr", ["silu(acc) * U", "gelu(acc + bias[col])"])
def test_nvrtc_compiles_them_without_local_memory(expr):
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    extra = "tensor U : bf16[M, N] row" if "U" in expr else "vector bias : f32[N]"
    plan = lower(_kernel(expr, extra=extra))
    try:
        result = compile_cubin(_source(plan), plan.name, "sm_90a",
                               extra_options=fast_entry_options(plan.narrow_kernel))
    except Exception as err:  # no NVRTC on this machine
        pytest.skip(f"NVRTC unavailable: {err}")
    assert (result.spill_stores, result.spill_loads, result.stack_bytes) == (0, 0, 0)


def test_the_plan_value_round_trips_through_dataclasses():
    m = EpilogueMath(True, "why")
    assert dataclasses.replace(m, intrinsics=False).describe("g") == [
        ("g epilogue math", "expf, IEEE division", "why")]
