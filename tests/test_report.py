"""kgen/report.py: `kgen inspect` says how each output leaves, in each entry point."""
from __future__ import annotations

from pathlib import Path

from kgen import api, ir
from kgen.report import output_paths, plan_summary
from tests.kernels import P, T, gemm_kernel

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_a_tma_stored_output_and_its_narrow_path():
    plan = api.build_file(EXAMPLES / "gemm_bias_relu.kg", "sm_90a").plan
    (d,) = output_paths(plan)
    assert d["param"] == "D" and "copy engine" in d["fast"]
    assert d["narrow"].startswith("element stores")
    assert plan_summary(plan)["output_paths"] == [d]


def test_column_major_outputs_say_element_stores_and_reductions_their_mode():
    acc = ir.Acc()
    extra = (P("E", T, ir.DType.F32, ("M", "N"), ir.Layout.COL, ir.Role.OUT),)
    stmts = (ir.Store("D", acc), ir.Store("E", ir.Call(ir.Op.NEG, (acc,))))
    plan = api.build(gemm_kernel(stmts, extra=extra)).plan
    d, e = output_paths(plan)
    assert d["fast"] == "row-major column pairs, one 4-byte store each"
    assert e["layout"] == "col" and e["fast"].startswith("column-major: each element")
    colsum = api.build_file(EXAMPLES / "evt_colsum.kg").plan
    assert [o["fast"] for o in output_paths(colsum)][1:] == [
        "per-CTA partials merged with atomics"] * 3


def test_a_chain_has_no_narrow_path():
    plan = api.build_file(EXAMPLES / "b2b_gemm_rf.kg").plan
    (d1,) = output_paths(plan)
    assert d1["narrow"] == "none (no narrow entry point)"
    assert d1["fast"].startswith("16-byte chunks")
