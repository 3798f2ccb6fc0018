"""The pictures: kgen tune's candidates and kgen run's roofline, as PNG files (matplotlib, the
`plot` extra)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from kgen.errors import KgenRuntimeError
from kgen.harness.run import RunReport
from kgen.harness.timing import Timing

pytest.importorskip("matplotlib")

from kgen.plot import candidates_chart, roofline  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def timing(ms):
    return Timing(ms, ms, ms, 3, 1, (ms,) * 3)


def row(label, ms, default=False):
    return SimpleNamespace(candidate=SimpleNamespace(label=label, default=default), ms=ms)


def test_candidates_chart(tmp_path):
    rows = [row("128x256x64 w2x4 s3", 1.2, default=True), row("128x128x64 w2x2 s4", 0.9),
            row("64x64x32 w2x2 s2", 2.5)]
    report = SimpleNamespace(timed_rows=rows, winner=rows[1], kernel="gemm", arch="sm_80",
                             sizes={"M": 4096}, device="NVIDIA H200")
    path = tmp_path / "candidates.png"
    candidates_chart(report, path)
    assert path.read_bytes().startswith(PNG)
    with pytest.raises(KgenRuntimeError, match="no candidate was timed"):
        candidates_chart(SimpleNamespace(**{**vars(report), "timed_rows": []}), path)


def run_report(device="NVIDIA H200", torch_ms=0.2):
    report = RunReport(kernel="gemm", plan_arch="sm_90a", compile_arch="sm_90a", device=device,
                       sizes={"M": 4096, "N": 4096, "K": 4096}, scalars={}, seed=0,
                       backend="torch", compile={}, flops=2 * 4096 ** 3,
                       bytes=3 * 4096 * 4096 * 2, timing=timing(0.18),
                       torch_timing=timing(torch_ms) if torch_ms else None,
                       peak_flops=989e12 if "H200" in device else None,
                       peak_bandwidth=4.8e12 if "H200" in device else None)
    return report


@pytest.mark.parametrize("report", [run_report(), run_report(torch_ms=None),
                                    run_report(device="Some GPU")])
def test_roofline(tmp_path, report):
    path = tmp_path / "roofline.png"
    roofline(report, path)
    assert path.read_bytes().startswith(PNG)


def test_roofline_needs_a_timing(tmp_path):
    report = run_report()
    report.timing = None
    with pytest.raises(KgenRuntimeError, match="add --bench"):
        roofline(report, tmp_path / "r.png")


def test_an_unwritable_path_is_a_clear_error(tmp_path):
    with pytest.raises(KgenRuntimeError, match="cannot write"):
        roofline(run_report(), tmp_path / "missing" / "r.png")
