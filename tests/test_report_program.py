"""`kgen inspect` for tile programs (kgen/report_program.py, through kgen/report.py): the plan
as data (JSON-ready) and as text, with the configuration, the MMA and why."""
from __future__ import annotations

import io
import json

from rich.console import Console

from kgen import ir
from kgen.lower import lower
from kgen.report import plan_summary, print_plan

from tests import loop_kernels as lk


def _text(summary) -> str:
    out = io.StringIO()
    print_plan(Console(file=out, width=200), summary)
    return out.getvalue()


def test_loop_summary_says_what_and_why():
    # the mma.sync skeleton's summary (sm_90a's wgmma one: tests/targets/test_loop_sm90.py)
    summary = plan_summary(lower(lk.attention(128, causal=True), ir.Arch.SM80))
    json.dumps(summary)
    assert summary["kind"] == "loop" and summary["threads"] == 128
    assert summary["mma"]["value"] == "mma.sync.m16n8k16" and "mma.sync" in summary["mma"]["why"]
    assert [t["offset"] for t in summary["buffers"]] == [0, 32768, 49152]
    assert "compute v4 = le(col, row) (tile)" in summary["body"]
    assert summary["body"][-2] == "update carry m = v11"
    assert summary["body"][0] == ("gemm s = A from a_smem (ldmatrix), B from b_smem (ldsm_b_nk): "
                                  "8 k16 steps x 4 n8 tiles per warp")
    assert summary["body"][-1].startswith("gemm o += A from registers (the value handed on)")
    assert "store lse = v10 (one per row)" in summary["epilogue"]
    text = _text(summary)
    assert "tile 128x32 warps 4 stages 2" in text and "rescale o *= v18 (per row)" in text


def test_row_kernel_summary():
    summary = plan_summary(lower(lk.rowdot(128)))
    json.dumps(summary)
    assert summary["kind"] == "rows" and summary["smem_bytes"] == 0
    assert summary["body"] == ["compute v2 = mul(dO, O) (tile)", "compute v3 = rowsum(v2) (row)",
                               "store D = v3 (one per row)"]
    assert "one warp per row, 4 rows per CTA" in _text(summary)


def test_summary_names_random_and_the_instance_values():
    from kgen.parse import parse

    text = """kernel rng {
  target sm_80
  tensor X : f32[B, H, S, 64] row
  tensor U : f32[B, H, S, 64] row out
  scalar seed : u64
  scalar offset : u64
  epilogue { U = random(seed, offset) + X * head }
}
"""
    summary = plan_summary(lower(parse(text, "rng.kg").kernels[0], ir.Arch.SM80))
    assert "compute v3 = mul(X, head) (tile)" in summary["body"]
    assert "compute v4 = add(random(seed, offset), v3) (tile)" in summary["body"]


def test_the_printed_loop_bounds_keep_an_equality_s_indices():
    """A document mask's bound prints as written (`qd[row]` escaped, not read as rich markup)."""
    from kgen import attention

    sig = attention.Signature("bf16", 64, 64, False, None, "qd[row] == kd[col]", (),
                              vectors=(("kd", "col"), ("qd", "row")))
    summary = plan_summary(lower(attention.program(sig), ir.Arch.SM80))
    assert summary["loop_bounds"]["bounds"] == ["qd[row] == kd[col] (scanned per tile)"]
    assert "loop bounds: qd[row] == kd[col] (scanned per tile)" in _text(summary)
