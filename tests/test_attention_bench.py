"""`kgen run --bench`'s attention baselines on the CPU: which programs are attention-shaped and
with which mask SDPA computes them, and how the report carries and prints the baselines' times
(the timing itself needs a GPU: tests/gpu/test_attention_gpu.py's neighbours run kgen run)."""
from __future__ import annotations

import io

from rich.console import Console

from kgen.api import build_file
from kgen.harness.attention_bench import AttentionCall, attention_call
from kgen.harness.run import RunReport
from kgen.harness.timing import Timing
from kgen.report import print_run_report


def _call(path: str):
    built = build_file(path, "sm_80")
    return attention_call(built.kernel, built.plan)


def test_attention_programs_are_recognised_with_their_mask():
    assert _call("examples/attention_fwd.kg") == AttentionCall("Q", "K", "V", causal=True)
    assert _call("examples/attention_fwd_window.kg") == AttentionCall("Q", "K", "V",
                                                                     causal=False)
    assert _call("examples/mlp_loop.kg") is None  # no heads: not attention-shaped
    assert _call("examples/attention_bwd_dot.kg") is None  # a row kernel


def _timing(ms: float) -> Timing:
    return Timing(ms, ms, ms, 10, 1, (ms,) * 10)


def test_the_report_carries_and_prints_the_baselines():
    report = RunReport(kernel="attention_fwd", plan_arch="sm_90a", compile_arch="sm_90a",
                       device="H200", sizes={"S": 4096}, scalars={}, seed=0, backend="torch",
                       compile={}, flops=4 * 10**12, timing=_timing(20.0),
                       baselines={"SDPA flash": _timing(10.0), "FlexAttention": _timing(40.0)})
    data = report.as_dict()["baselines"]
    assert data["SDPA flash"] == {"time_ms": 10.0, "tflops": 400.0, "speedup": 0.5}
    assert data["FlexAttention"]["speedup"] == 2.0
    out = io.StringIO()
    print_run_report(Console(file=out, width=120), report)
    text = out.getvalue()
    assert "attention baselines" in text and "SDPA flash" in text and "0.50x" in text
