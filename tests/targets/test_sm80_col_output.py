"""sm_80's one-gemm kernel with a column-major 16-bit output (issue 16): the fast entry point
stores 16-byte chunks of 8 rows (movmatrix transposes each 8x8 block of pairs in registers,
the quad transpose gathers four blocks), the narrow one element stores; the output's columns
must then be 16-byte aligned. A row-major output stays pairs; warp tiles of 16 rows, split-K
and outputs with reductions keep element stores, each with its reason."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import StorePath
from kgen.report import output_paths
from kgen.verify import verify

TEXT = """
kernel colout {{
  target {arch}
  tensor A : {t}[M, K] row
  tensor B : {t}[K, N] col
  tensor C : {t}[M, N] col
  tensor D : {t}[M, N] {d} out
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = relu(alpha * acc + C + bias[col]) }}
  }}
}}
"""


def kernel(d="col", t="f16", lines="", arch="sm_80") -> ir.Kernel:
    module = parse(TEXT.format(d=d, t=t, lines=lines, arch=arch), "colout.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_a_column_major_output_leaves_in_16_byte_chunks(t):
    plan = lower(kernel(t=t))
    g = plan.schedule.gemms[0]
    assert g.store is StorePath.WIDE and "movmatrix" in g.why_store
    (d,) = [a for a in plan.alignments if a.param == "D"]
    assert (d.ptr_bytes, d.ld_multiple) == (16, 8) and "8 rows" in d.reason
    (path,) = output_paths(plan)
    assert "16-byte chunks of 8 rows" in path["fast"]
    assert path["narrow"].startswith("element stores")


def test_a_row_major_output_stays_pairs():
    g = lower(kernel(d="row")).schedule.gemms[0]
    assert g.store is StorePath.PAIRS


@pytest.mark.parametrize("lines, why", [
    ("tile 64x128x64 warps 4x1 stages 3", "whole 32 rows, not 16"),
    ("tile 128x128x64 warps 2x2 stages 3 split 4", "split-K"),
])
def test_element_stores_where_chunks_cannot_serve(lines, why):
    g = lower(kernel(lines=lines)).schedule.gemms[0]
    assert g.store is StorePath.PAIRS and why in g.why_store


def test_the_source_transposes_in_registers_and_stores_chunks():
    from kgen.emit import emit

    source = emit(lower(kernel()), source_name="colout.kg", source_hash="", command="test")
    assert "movmatrix.sync.aligned.m8n8.trans.b16" in source
    assert "g_epilogue_packed(p, row, col" in source
    assert "*reinterpret_cast<uint4*>(to) = chunk;" in source
    assert "if constexpr (kNarrow) {  // any alignment: element stores" in source


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_compiles_without_spills(t, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    from kgen.api import build, compile_source

    built = build(kernel(t=t), "sm_80", source_name="colout.kg")
    assert built.plan.schedule.gemms[0].store is StorePath.WIDE
    result = compile_source(built.source, built.plan.name, "sm_80")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log
