"""On a GPU: `kgen run` of the attention backward (examples/attention_bwd.kg) through the
harness: inputs an attention's (lse and D derived), every output checked against the float64
reference, and --bench's SDPA backward baselines timed beside it; and the CLI's JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "examples" / "attention_bwd.kg"


def _gpu():
    from kgen.runtime.device import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA GPU")


@pytest.mark.parametrize("sizes", [{"B": 1, "H": 2, "S": 1000, "T": 777},
                                   {"B": 2, "H": 3, "S": 17, "T": 4097}],
                         ids=["s1000-t777", "s17-t4097"])
def test_the_backward_runs_and_checks(sizes):
    _gpu()
    from kgen.api import build_file
    from kgen.harness.run import run

    built = build_file(PROGRAM)
    report = run(built.kernel, built.plan, built.source, sizes, check=True)
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    assert {c.name for c in report.checks} == {"dQ", "dK", "dV"}
    assert any("log-sum-exp of the program's own scores" in n for n in report.notes)


def test_the_cli_benches_it_beside_sdpa_backward():
    _gpu()
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-m", "kgen", "run", str(PROGRAM), "--bench",
                           "--json", "--iters", "5", "--size", "B=2,H=4,S=1024,T=1024"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["time_ms"] > 0
    assert report["flops"] == 5 * 2 * 1024 * 1024 * 128 * 2 * 4
    timed = {name for name, b in report["baselines"].items() if b["time_ms"]}
    assert timed & {"SDPA cuDNN bwd", "SDPA flash bwd", "SDPA efficient bwd"}, report["notes"]
    print({name: round(b["tflops"], 1) for name, b in report["baselines"].items()},
          round(report["tflops"], 1))
