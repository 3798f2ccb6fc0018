"""A column-major 16-bit output on the sm_90a warp-specialized GEMM (no GPU): it leaves through
the copy engine like a row-major one, staged transposed (stmatrix .trans) under a tensor map of
N rows of M contiguous elements; a C of the same layout is staged too (ldmatrix .trans), one of
the other layout is read from global memory; `kgen inspect` says how it leaves; NVRTC compiles
every variant without spills. The GPU tests: tests/gpu/test_col_output_gpu.py."""
from __future__ import annotations

import pytest

from kgen.api import build
from kgen.parse import parse
from kgen.plan import StorePath
from kgen.report import output_paths

SOURCE = """\
kernel k {{
  target sm_90a
  {schedule}
  tensor A : bf16[{batch}M, K] row
  tensor B : bf16[{batch}K, N] col
  tensor C : bf16[{batch}M, N] {c}
  tensor D : bf16[{batch}M, N] {d} out
  vector bias : f32[N]
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {epilogue} }}
  }}
}}
"""
PINGPONG = dict(schedule="schedule pingpong", lines="tile 128x128x64  warps 2x4  stages 5")


def _built(d="col", c="col", epilogue="relu(acc + C + bias[col])", schedule="",
           lines="tile 128x256x64  warps 2x4  stages 3", batch=""):
    text = SOURCE.format(d=d, c=c, epilogue=epilogue, schedule=schedule, lines=lines,
                         batch=batch)
    return build(parse(text, "k.kg").kernels[0])


def test_a_column_major_output_leaves_through_the_copy_engine_transposed():
    built = _built(epilogue="acc")
    s = built.plan.schedule
    assert s.gemms[0].output.path is StorePath.TMA
    (d,) = [m for m in s.tensor_maps if m.store]
    assert (d.param, d.rows, d.cols, d.box) == ("D", "N", "M", (64, 64))
    assert "transposed" in d.why
    src = built.source
    assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in src
    # whole 16-byte chunks of rows, else the tile is copied out of the staging, transposed
    assert "const bool whole_chunks = m0 + kTileM <= M || M % 8 == 0;" in src
    assert "copy_box_out(p.D, p.ld_D, staging + b * kStagingBoxBytes, n0 + box * 64, " \
           "m0 + row0 + i * 64, N, M);  // transposed" in src
    assert "tma_store_box(&maps.D, staging + (i * kBoxesN + box) * kStagingBoxBytes, " \
           "m0 + row0 + i * 64, n0 + box * 64);" in src
    (align,) = [a for a in built.plan.alignments if a.param == "D"]
    assert (align.ptr_bytes, align.ld_multiple) == (16, 8) and "8 rows" in align.reason
    (row,) = [r for r in output_paths(built.plan) if r["param"] == "D"]
    assert "transposed" in row["fast"] and "copy engine" in row["fast"]


def test_a_column_major_c_is_staged_with_it():
    built = _built()
    g = built.plan.schedule.gemms[0]
    assert g.staged.param == "C"
    (c,) = [m for m in built.plan.schedule.tensor_maps if m.param == "C"]
    assert (c.rows, c.cols, c.store) == ("N", "M", False)
    src = built.source
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in src
    assert "input_full + 8 * consumer, m0 + row0 + i * 64, n0 + box * 64);" in src


@pytest.mark.parametrize("d, c", [("col", "row"), ("row", "col")])
def test_a_c_of_the_other_layout_is_read_from_global_memory(d, c):
    built = _built(d=d, c=c)
    g = built.plan.schedule.gemms[0]
    assert g.output.path is StorePath.TMA and g.staged.param is None
    assert f"takes a {d}-major 16-bit input (the output's layout)" in g.staged.why
    assert ".trans" not in built.source or d == "col"


def test_a_row_major_output_is_staged_as_before():
    src = _built(d="row", c="row").source
    assert ".trans" not in src
    assert "const bool whole_chunks = n0 + kTileN <= N || N % 8 == 0;" in src


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bare", "cooperative", "pingpong", "batched", "c_row",
                                     "cluster"])
def test_nvrtc_compiles_without_spills(variant):
    """The bare kernel spilled 8 bytes (its element stores where a tile misses the staging,
    issued all at once) until those stores were ordered; the GPU run's warning found it."""
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    options = {"bare": dict(epilogue="acc"), "cooperative": {}, "pingpong": PINGPONG,
               "batched": dict(batch="L, "),
               "c_row": dict(c="row"),
               "cluster": dict(lines="tile 128x256x64  warps 2x4  stages 3  cluster 2x1")}[variant]
    built = _built(**options)
    assert built.plan.schedule.gemms[0].output.path is StorePath.TMA
    ptx = compile_ptx(built.source, built.plan.name, "sm_90a")
    assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    rank = "3d" if variant == "batched" else "2d"
    assert f"cp.async.bulk.tensor.{rank}.global.shared::cta" in ptx
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log
