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


def test_the_gemms_table_and_the_filled_warps_line_say_the_same_warps():
    """Issue 49: on sm_90a the gemms table said 8x1 and the filled line `warps 2x4`. Both are
    now the warps the kernel runs (the plan's), in the table and in --json alike."""
    from kgen.lower.builder import free
    from kgen.parse import parse

    for name, warps in (("gemm_bias_relu.kg", [8, 1]), ("evt_multi_output.kg", [4, 1])):
        (kernel,) = parse((EXAMPLES / name).read_text(), name).kernels
        summary = plan_summary(api.build(free(kernel), "sm_90a").plan)
        (gemm,) = summary["gemms"]
        (line,) = [row for row in summary["schedule"] if row["setting"].endswith(" warps")]
        assert gemm["warps"] == warps, name  # cooperative: 8x1; ping-pong: a consumer's 4x1
        assert line["value"] == "x".join(map(str, warps)), name
