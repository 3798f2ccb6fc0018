"""`scalar s : f32 = 1 positive`: the language's positive scalars (ir.Param.positive). The parser
and the verifier's rules, the launch checks (the runtime's, for gemm kernels and tile programs,
and the .cu's own launchers), and what the compiler derives from one (a mask's blocks skipped
through scale * (x - m): tests/lower/test_program_bounds.py)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.errors import ArgumentError, KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.runtime.program import bind_program
from kgen.verify import verify, verify_kernel

from tests import loop_kernels as lk
from tests.runtime.test_program_binding import attention_args

GEMM = """kernel k {{
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  {decl}
  gemm mma0 = A @ B accumulate f32 {{
    epilogue {{
      D = s * acc
    }}
  }}
}}
"""


def kernel(decl: str) -> ir.Kernel:
    module = parse(GEMM.format(decl=decl), "p.kg")
    verify(module)
    return module.kernels[0]


def test_the_modifier_reaches_the_ir_and_the_plans():
    k = kernel("scalar s : f32 = 0.5 positive")
    assert k.param("s").positive and not k.param("A").positive
    assert lower(k).param("s").positive
    assert lower(lk.attention(64, raw_max=True)).param("scale").positive
    assert not lower(lk.attention(64)).param("scale").positive


@pytest.mark.parametrize("decl, message", [
    ("scalar s : f32 = 0.5 positive positive", "p.kg:6:33: error: 's' is already marked "
     "'positive'"),
    ("scalar s : f32 = 0 positive", "p.kg:6:3: error: scalar 's' is marked 'positive' but its "
     "default is 0; give a default > 0 or none"),
    ("scalar s : f32 = -2 positive", "p.kg:6:3: error: scalar 's' is marked 'positive' but "
     "its default is -2; give a default > 0 or none"),
    ("scalar s : f32\n  vector v : f32[N] positive", "p.kg:7:3: error: 'positive' marks an "
     "input f32 scalar, checked > 0 at every launch; 'v' is a vector"),
    ("scalar s : f32 out positive", "p.kg:6:3: error: 'positive' marks an input f32 scalar, "
     "checked > 0 at every launch; 's' is an output scalar"),
])
def test_misuse_is_located(decl, message):
    text = GEMM.format(decl=decl)
    with pytest.raises(KgenError) as info:
        verify(parse(text, "p.kg"))
    assert str(info.value) == message


def test_a_u64_scalar_cannot_be_positive():
    k = lk.attention(64, raw_max=True)
    seed = ir.Param("seed", ir.ParamKind.SCALAR, ir.DType.U64, (), positive=True)
    with pytest.raises(KgenError, match="'positive' marks an input f32 scalar, checked > 0 at "
                                        "every launch; 'seed' is a u64 scalar"):
        verify_kernel(dataclasses.replace(k, params=(*k.params, seed)))


def test_a_default_left_out_is_allowed():
    assert kernel("scalar s : f32 positive").param("s").default is None


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, -math.inf])
def test_a_gemm_kernel_launch_refuses_a_value_not_positive(value):
    from kgen.runtime.launch import bind_arguments
    from tests.runtime.test_args import Fake

    plan = build_verified(kernel("scalar s : f32 = 0.5 positive"), "sm_80").plan
    args = dict(A=Fake((64, 32)), B=Fake((32, 64), strides=(1, 32)), D=Fake((64, 64)))
    assert bind_arguments(plan, args, device_of=lambda p: None).scalars == {"s": 0.5}
    assert bind_arguments(plan, {**args, "s": 3}, device_of=lambda p: None).scalars["s"] == 3
    with pytest.raises(ArgumentError, match=r"^scalar s is declared positive, so it must be "
                                            r"> 0; got "):
        bind_arguments(plan, {**args, "s": value}, device_of=lambda p: None)


@pytest.mark.parametrize("value", [0.0, -0.125, math.nan])
def test_a_program_launch_refuses_a_value_not_positive(value):
    plan = lower(lk.attention(64, raw_max=True))
    bind_program(plan, {**attention_args(hkv=8), "scale": 0.125}, None)
    with pytest.raises(ArgumentError, match=r"^scalar scale is declared positive, so it must "
                                            r"be > 0; got "):
        bind_program(plan, {**attention_args(hkv=8), "scale": value}, None)
    plain = lower(lk.attention(64))  # not declared: any value is the caller's
    bind_program(plain, {**attention_args(hkv=8), "scale": value}, None)


def test_the_cu_launchers_check_it():
    """The .cu's own launchers return cudaErrorInvalidValue with a reason for a value <= 0 or
    NaN (!(s > 0)), as the runtime refuses it."""
    gemm = build_verified(kernel("scalar s : f32 = 0.5 positive"), "sm_80").source
    assert 'if (!(p.s > 0.0f)) return "s is declared positive: it must be > 0";' in gemm
    for arch in ("sm_80", "sm_90a"):
        source = build_verified(lk.attention(64, raw_max=True, arch=ir.Arch(arch)), arch).source
        assert ('if (!(p.scale > 0.0f)) return "scale is declared positive: it must be > 0";'
                in source)
        assert "float scale;  // scalar scale (declared positive: > 0)" in source
        plain = build_verified(lk.attention(64, arch=ir.Arch(arch)), arch).source
        assert "declared positive" not in plain
