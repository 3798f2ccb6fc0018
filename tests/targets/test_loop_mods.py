"""The attention mods' plan choices in both loop skeletons (no GPU): the body's tanh by the
hardware's instruction (plan.tanh, said in the .cu and by `kgen inspect`), never in a kernel
without tanh or in the kernel's epilogue."""
from __future__ import annotations

import dataclasses
import re

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.plan import program as pp
from kgen.report_program import program_summary

from tests import loop_kernels as lk

ARCHS = [ir.Arch.SM80, ir.Arch.SM90A]


def _kernel_body(source: str) -> str:
    """The .cu from the kernel's entry on (the helpers above it define tanh_approx)."""
    return source[source.index('extern "C" __global__'):]


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_softcap_body_takes_the_hardware_tanh_and_says_why(arch):
    built = build_verified(lk.attention(128, softcap=30.0, causal=True, arch=arch), arch)
    assert built.plan.tanh.value == pp.TANH_APPROX
    assert "2^-10.99" in built.plan.tanh.why
    source = built.source
    assert "asm(\"tanh.approx.f32 %0, %1;\"" in source
    assert "// tanh in the loop's body: tanh.approx.f32 (" in source
    body = _kernel_body(source)
    assert "tanh_approx(" in body and "tanhf(" not in body
    summary = program_summary(built.plan)
    assert summary["tanh"]["value"] == "tanh.approx.f32"


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_a_kernel_without_tanh_keeps_every_byte(arch):
    built = build_verified(lk.attention(128, alibi=True, arch=arch), arch)
    assert built.plan.tanh.value == "none"
    assert "tanh" not in built.source
    assert program_summary(built.plan)["tanh"]["value"] == "none"


def test_the_kernels_epilogue_keeps_tanhf():
    """tanh after the loop runs once per tile of rows: full precision there."""
    kernel = lk.attention(64, softcap=30.0, arch=ir.Arch.SM80)
    o_store = kernel.epilogue.stmts[0]
    tanh_o = ir.Store("O", ir.Call(ir.Op.TANH, (o_store.value,)))
    kernel = dataclasses.replace(
        kernel, epilogue=ir.Epilogue((tanh_o,) + kernel.epilogue.stmts[1:]))
    body = _kernel_body(build_verified(kernel, ir.Arch.SM80).source)
    assert re.search(r"tanhf\(", body) and "tanh_approx(" in body
