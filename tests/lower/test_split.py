"""`split S`: the split-K schedule of a one-gemm kernel, and its refusals, located."""
from __future__ import annotations

import dataclasses

import pytest

from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import FieldKind, KernelKind
from kgen.verify import verify

SOURCE = """kernel s {{
  target {arch}
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  vector r : f32[M] out
  gemm g0 = A @ B accumulate f32 {{
    tile 128x128x64  warps 2x4  stages 3  {split}
    epilogue {{ {epilogue} }}
  }}
}}
"""


def source(split="split 4", epilogue="D = acc", arch="sm_80") -> str:
    text = SOURCE.format(split=split, epilogue=epilogue, arch=arch)
    # the row-sum output only where the epilogue writes it (the line numbers stay)
    return text if "rowsum" in epilogue else text.replace("vector r : f32[M] out", "")


def plan(split="split 4", epilogue="D = acc", arch="sm_80"):
    module = parse(source(split, epilogue, arch), "s.kg")
    verify(module)
    return lower(module.kernels[0])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_split_plans_the_tiled_kernel_with_a_workspace(arch):
    p = plan(arch=arch)
    assert p.schedule.kind is KernelKind.TILED and p.schedule.split_k == 4
    assert p.split_kernel == "s_splitk"
    assert any(f.kind is FieldKind.WORKSPACE for f in p.fields)
    sizes = {"M": 100, "N": 300, "K": 1000}
    assert p.grid(sizes) == (1 * 3 * 4, 1, 1)
    assert p.workspace_floats(sizes) == 4 * 100 * 384
    assert p.split_grid(sizes) == (-(-100 * 150 // 256), 1, 1)
    rows = {label: (value, why) for label, value, why in p.schedule.describe()}
    assert rows["split-K"][0] == "4 CTAs per output tile"
    if arch == "sm_90a":
        assert rows["not cooperative"][1].startswith("split 4 runs on the tiled kernel")


def test_split_1_is_the_plain_kernel():
    p = plan("split 1")
    assert p.schedule.split_k == 1 and p.split_kernel is None
    assert not any(f.kind is FieldKind.WORKSPACE for f in p.fields)


@pytest.mark.parametrize("split, epilogue, message", [
    ("split 0", "D = acc", "split must be a positive integer, got 0"),
    ("split 65", "D = acc", "split must be at most 64 CTAs per output tile, got 65"),
    ("split 2", "D = acc\n r = rowsum(acc)", "split with epilogue reductions is not supported"),
])
def test_refusals_point_at_the_split_line(split, epilogue, message):
    with pytest.raises(KgenError) as err:
        plan(split, epilogue)
    assert message in err.value.message
    assert err.value.loc.line == 8


def test_schedule_cooperative_with_split_is_refused_at_the_split():
    text = source("split 2", "D = acc", "sm_90a").replace(
        "  target sm_90a\n", "  target sm_90a\n  schedule cooperative\n")
    module = parse(text, "s.kg")
    verify(module)
    with pytest.raises(KgenError) as err:
        lower(module.kernels[0])
    assert err.value.loc.line == 9 and "split 2 runs on the tiled kernel" in err.value.message


def test_a_chain_takes_no_split():
    chain = """kernel c {
  target sm_80
  tensor A : f16[M, 64] row
  tensor B0 : f16[64, 64] col
  tensor B1 : f16[64, 64] col
  tensor D : f16[M, 64] row out
  gemm g0 = A @ B0 accumulate f32 {
    tile 128x64x64  warps 4x1  stages 2  split 2
    epilogue { g0 = acc }
  }
  gemm g1 = g0 @ B1 accumulate f32 {
    tile 128x64x32  warps 4x1  stages 2
    keep g0 in registers
    epilogue { D = acc }
  }
}
"""
    with pytest.raises(KgenError) as err:
        verify(parse(chain, "c.kg"))
    assert (err.value.loc.line, "split applies to a kernel of one gemm") == (
        8, err.value.message[:37])


def test_the_ir_field_is_checked():
    module = parse(source("", "D = acc", "sm_80"), "s.kg")
    k = module.kernels[0]
    gemm = dataclasses.replace(k.gemms[0], split=4)  # an int, not an ir.SplitK
    bad = dataclasses.replace(module, kernels=(dataclasses.replace(k, gemms=(gemm,)),))
    with pytest.raises(KgenError, match="split must be a kgen.ir.SplitK or None"):
        verify(bad)
