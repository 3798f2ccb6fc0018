"""sm_90a's ping-pong chain with the feeding epilogue's column vectors loaded before the mainloop
(EpilogueVectors, REGISTERS): the rule (every column vector of a feeding gemm, where they fit a
consumer thread's registers beside the accumulators), inspect, the emitted loads and epilogue
function, one home for the choice, and NVRTC with no spill."""
from __future__ import annotations

import re

import pytest

from kgen import ir
from kgen.api import build
from kgen.parse import parse
from kgen.plan import EpilogueVectors, VectorHome
from kgen.targets.sm90 import chain as sm90_chain
from kgen.targets.sm90 import schedules
from kgen.verify import verify

from tests.kernels import chain_vectors_text, with_gemm_schedule


def chain(k0: int, n0: int, n1: int, dtype: str = "f16", epilogue: str | None = None,
          vectors: str = "f32") -> ir.Kernel:
    module = parse(chain_vectors_text(dtype, k0, n0, n1, vectors, epilogue), "chain.kg")
    verify(module)
    return module.kernels[0]


def g0_epilogue(source: str) -> str:
    start = source.index("__device__ __forceinline__ void g0_epilogue(")
    return source[start:source.index("\n}\n", start)]


def g0_stage(source: str) -> str:
    start = source.index("// ---- g0 = A @ B0")
    return source[start:source.index("// ---- g1 = g0 @ B1", start)]


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 128, 64, "f16"), (256, 128, 256, "bf16"),
                                               (576, 64, 64, "f16"), (256, 160, 320, "f16")])
def test_the_column_vectors_are_loaded_before_the_mainloop(k0, n0, n1, dtype):
    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    plan, source = result.plan, result.source
    assert plan.schedule.scheduler.kind.value == "pingpong"
    assert plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS) == ("scale0", "bias0")
    assert plan.schedule.gemms[-1].vectors.held(VectorHome.REGISTERS) == ()
    stage = g0_stage(source)
    loads = stage.index("early_scale0[j] = *reinterpret_cast<const float2*>(p.scale0 + c);")
    assert loads < stage.index("mbarrier_wait(full_bar") < stage.index("wgmma_commit();")
    assert "early_bias0[j] = *reinterpret_cast<const float2*>(p.bias0 + c);" in stage
    # the epilogue takes them, and reads no vector from global memory
    function = g0_epilogue(source)
    assert "float2 early_scale0, float2 early_bias0)" in function
    assert "p.scale0" not in function and "p.bias0" not in function
    assert len(re.findall(r"g0_epilogue\(p, [^;]*, early_scale0\[j\], early_bias0\[j\]\);",
                          stage)) == 2
    rows = {label: (value, why) for label, value, why in plan.schedule.describe()}
    value, why = rows["g0 epilogue vectors"]
    assert value == "scale0, bias0 in registers, loaded before the mainloop"
    assert "same in every tile" in why


def test_16_bit_vectors_take_their_pair_type():
    result = build(chain(256, 128, 128, "bf16", vectors="bf16"), ir.Arch.SM90A,
                   source_name="chain.kg")
    first = result.plan.gemms[0]
    assert result.plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS) == ("scale0", "bias0")
    assert schedules.early_registers(first, ("scale0", "bias0")) == first.frags[1] * 2
    assert "__nv_bfloat162 early_scale0[kFragN];" in result.source
    assert "__nv_bfloat162 early_scale0, __nv_bfloat162 early_bias0)" in g0_epilogue(
        result.source)


def test_a_row_vector_stays_in_the_epilogue():
    """Only column vectors are the same in every tile; the feed then runs on live rows only."""
    result = build(chain(256, 128, 64, epilogue="g0 = relu(acc * scale0[col] + rowb[row])"),
                   ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS) == ("scale0",)
    assert list(result.plan.gemms[0].epilogue.column_vectors) == ["scale0"]  # not rowb
    function = g0_epilogue(result.source)
    assert "p.rowb[row]" in function and "p.scale0" not in function
    assert "if (m0 + r < M) g0_epilogue(p, m0 + r, c, acc[i][j][0], acc[i][j][1], x0, x1, " \
        "early_scale0[j]);" in result.source


def test_none_where_they_do_not_fit_beside_the_accumulators():
    """N0 = 256: 128 accumulators and 128 registers of two f32 vectors (64 of two 16-bit ones)
    are over a consumer's 232 less EARLY_RESERVE. N0 = 192: 96 accumulators fit beside 48
    registers of 16-bit vectors, not beside 96 of f32 ones."""
    for n0, vectors, early in [(256, "f32", ()), (256, "f16", ()), (192, "f32", ()),
                               (192, "f16", ("scale0", "bias0"))]:
        plan = build(chain(256, n0, 64, vectors=vectors), ir.Arch.SM90A,
                     source_name="chain.kg").plan
        first = plan.gemms[0]
        assert plan.schedule.scheduler.kind.value == "pingpong" and first.tile[1] == n0
        assert plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS) == early
        assert schedules.early_vectors(first, 2) == early
        assert ("g0 epilogue vectors" in {r[0] for r in plan.schedule.describe()}) == bool(early)


def test_three_consumers_take_them_within_their_registers():
    plan = build(chain(256, 64, 128), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.schedule.warps.role("consumer").groups == 3
    assert plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS) == ("scale0", "bias0")
    assert schedules.early_vectors(plan.gemms[0], 3) == ("scale0", "bias0")


def test_the_schedule_value_alone_switches_the_loads():
    """One home: the emitter reads EpilogueVectors, REGISTERS, nothing else."""
    plan = build(chain(256, 128, 128), ir.Arch.SM90A, source_name="chain.kg").plan
    off = with_gemm_schedule(plan, 0, vectors=EpilogueVectors())
    source = sm90_chain.emit(off, source_name="chain.kg", source_hash="", command="test")
    assert "early_" not in source
    assert "*reinterpret_cast<const float2*>(p.scale0 + col)" in g0_epilogue(source)


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 128, 128, "f16"), (256, 64, 128, "bf16"),
                                               (256, 160, 320, "f16")])
def test_early_vectors_compile_without_spills(k0, n0, n1, dtype):
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS)
    resources = compile_cubin(result.source, result.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0


def test_none_beside_a_later_gemm_on_mma_sync():
    """N0 = 112: g1's k tile is 16 and g1 runs on mma.sync, where NVRTC spilled with them."""
    plan = build(chain(256, 112, 320), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.schedule.scheduler.kind.value == "pingpong"
    assert plan.schedule.gemms[-1].atom.instruction.name != "WGMMA_RS"
    assert plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS) == ()
