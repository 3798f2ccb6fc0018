"""`kgen inspect` on storage: the JSON schema for tools, the table and strip chart for people;
a kernel with storage but no gemm inspects and refuses to compile, with a located message."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kgen.cli import cli
from kgen.report import storage_chart

ROOT = Path(__file__).resolve().parent.parent
ATTENTION = ROOT / "examples" / "attention_bwd_seed_storage.kg"

STORAGE_ONLY = """# A storage plan without a gemm.
kernel plan_only {
  target sm_80
  phases { load, math, store }
  storage {
    union { x : f16[64, 64] live(load); y : f32[64, 32] live(store) }
    z : f16[1024] live(math)
  }
}
"""


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_inspect_json_lists_every_buffer_with_its_lifetime():
    result = invoke("inspect", str(ATTENTION), "--json")
    assert result.exit_code == 0, result.output
    (k,) = json.loads(result.output)["kernels"]
    assert {"name", "arch", "smem_bytes", "smem_limit", "buffers"} <= set(k)
    assert (k["name"], k["arch"], k["smem_bytes"], k["smem_limit"]) == (
        "attention_bwd_seed_storage", "sm_80", 52480, 163 * 1024)
    assert (k["smem_declared"], k["smem_packed"], k["smem_peak"]) == (52480, 51456, 51456)
    phases = k["phases"]
    assert phases[0] == "qk.mainloop" and phases[-1] == "tail" and len(phases) == 14
    by_name = {b["name"]: b for b in k["buffers"]}
    assert len(by_name) == 20
    for b in k["buffers"]:
        assert {"name", "offset", "bytes", "align", "live"} <= set(b)
        first, last = b["live"]
        assert b["live_phases"] == [phases[first], phases[last]]
        assert b["offset"] % b["align"] == 0
    q = by_name["mm_qk_q"]
    assert (q["offset"], q["bytes"], q["live"], q["live_ranges"]) == (8448, 8192, [0, 13],
                                                                     [[0, 0], [13, 13]])
    assert q["placed"] == "declared" and q["dtype"] == "f16" and q["swizzle"] is None
    assert by_name["a_smem"]["placed"] == "packer" and by_name["a_smem"]["swizzle"]


def test_inspect_draws_the_table_and_the_strip_chart():
    result = invoke("inspect", str(ATTENTION))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "storage over phases" in out
    chart = out[out.index("storage over phases"):]
    rows = {line.split()[0]: line for line in chart.splitlines()[1:] if line.strip()}
    # mm_qk_q is live in phase 0 and phase 13 only: its cells say so.
    q = rows["mm_qk_q"]
    assert "8,448..16,640" in q
    assert q.rstrip().endswith("\u00b7 \u2588\u2588")
    assert q.count("\u2588\u2588") == 2
    assert rows["di"].count("\u2588\u2588") == 14
    assert "peak live 51,456 B" in out and "storage declaration 52,480 B" in out
    assert "packer alone 51,456 B" in out


def test_strip_chart_rows_follow_offsets_and_sum_live_bytes():
    summary = {
        "phases": ["a", "b"],
        "buffers": [
            {"name": "y", "offset": 64, "bytes": 32, "live_ranges": [[1, 1]]},
            {"name": "x", "offset": 0, "bytes": 64, "live_ranges": [[0, 1]]},
        ],
    }
    lines = storage_chart(summary)
    assert lines[1].startswith("x ") and lines[2].startswith("y ")
    assert lines[1].endswith("\u2588\u2588\u2588\u2588")
    assert lines[2].endswith("\u00b7 \u2588\u2588")
    assert lines[-1] == "phases: 0 a (64 B), 1 b (96 B)"


def test_storage_only_kernel_inspects_but_does_not_compile(tmp_path):
    path = tmp_path / "plan_only.kg"
    path.write_text(STORAGE_ONLY)
    result = invoke("inspect", str(path), "--json")
    assert result.exit_code == 0, result.output
    (k,) = json.loads(result.output)["kernels"]
    assert k["gemms"] == [] and k["smem_bytes"] == 8192
    offsets = {b["name"]: b["offset"] for b in k["buffers"]}
    assert offsets["x"] == offsets["y"] == 0  # declared union
    assert offsets["z"] == 0  # packed: x and y are dead while z lives
    text = invoke("inspect", str(path))
    assert text.exit_code == 0 and "no gemm: storage plan only" in text.output
    result = CliRunner().invoke(cli, ["compile", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"{path}:2:1: error: kernel 'plan_only' has no gemm to "
                                    "emit; kgen inspect shows its storage plan")
    assert "Traceback" not in result.output


def test_overlapping_union_is_a_located_error(tmp_path):
    path = tmp_path / "bad.kg"
    path.write_text(STORAGE_ONLY.replace("live(store)", "live(load..store)"))
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert lines[0] == (f"{path}:6:41: error: 'y' and 'x' at line 6 share bytes 0..8192 but are "
                        "both live in phase 'load' ('y' is live load..store, 'x' load); put them "
                        "in a struct, not a union, or shorten a lifetime")
    assert lines[2].strip().startswith("^")
