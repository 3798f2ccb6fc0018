"""kgen/harness/run.py on the CPU: the run of `kgen run` with its GPU pieces replaced by NumPy
(the "kernel" computes the reference itself), so that the harness's wiring (inputs, outputs
poisoned with NaN, the check, the report) is tested without a GPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kgen.harness.run as harness
from kgen import ir
from kgen.api import build_file
from kgen.reference import evaluate, host_dtype
from kgen.runtime.device import DeviceInfo

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


class HostArrays:
    """The arrays API of harness.arrays, on host NumPy arrays."""

    name = "host"

    def __init__(self, device_id):
        pass

    def upload(self, host, param):
        return np.array(host)

    def empty(self, shape, param):
        return np.full(shape, np.nan, dtype=host_dtype(param.dtype))

    def download(self, array, param):
        return np.array(array)

    def copy(self, array):
        return np.array(array)

    def stream(self):
        return 0


class NumpyKernel:
    """Stands in for a CompiledKernel: its launch writes the reference's outputs, with
    `break_row` rows left unwritten (NaN) or `wrong` added to one element."""

    compiled = None

    def __init__(self, kernel, break_row=None, wrong=0.0):
        self.kernel = kernel
        self.break_row = break_row
        self.wrong = wrong

    def bind(self, **args):
        return args

    def launch(self, bound, stream):
        inputs = {p.name: bound[p.name] for p in self.kernel.params
                  if p.role is ir.Role.IN and p.kind is not ir.ParamKind.SCALAR}
        scalars = {name: value for name, value in bound.items() if np.ndim(value) == 0}
        for name, value in evaluate(self.kernel, inputs, scalars).items():
            out = bound[name]
            out[...] = np.asarray(value).reshape(out.shape)
            if self.break_row is not None and out.ndim == 2:
                out[self.break_row] = np.nan
            out.flat[0] += self.wrong


@pytest.fixture
def cpu_harness(monkeypatch):
    info = DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 132, 50 << 20, 232448, 1980000)
    monkeypatch.setattr(harness, "require_gpu", lambda what: None)
    monkeypatch.setattr(harness, "device_info", lambda device_id: info)
    monkeypatch.setattr(harness, "BufferArrays", HostArrays)
    monkeypatch.setattr(harness, "sync", lambda stream, what: None)
    import kgen.runtime.device as device

    monkeypatch.setattr(device, "current_device_id", lambda: 0)
    monkeypatch.setattr(device, "activate", lambda device_id: None)


def _run(example, sizes, **kernel_options):
    built = build_file(EXAMPLES / example)
    return harness.run(built.kernel, built.plan, built.source, sizes, use_torch=False,
                       compiled=NumpyKernel(built.kernel, **kernel_options))


def test_a_correct_kernel_passes(cpu_harness):
    report = _run("gemm_bias_relu.kg", {"M": 200, "N": 136, "K": 64})
    assert report.checked and report.ok and report.checks
    assert report.flops == 2 * 200 * 136 * 64 and report.bytes > 0
    assert report.device.startswith("NVIDIA H100") and report.peak_flops
    assert report.as_dict()["ok"] is True


def test_unwritten_rows_and_wrong_values_fail(cpu_harness):
    unwritten = _run("gemm_bias_relu.kg", {"M": 200, "N": 136, "K": 64}, break_row=7)
    (check,) = unwritten.checks
    assert not unwritten.ok and check.result.unwritten == 136
    wrong = _run("gemm_bias_relu.kg", {"M": 200, "N": 136, "K": 64}, wrong=10.0)
    assert not wrong.ok and wrong.checks[0].result.bad == 1


def test_large_m_checks_a_subset_but_every_row_for_nan(cpu_harness):
    report = _run("gemm_bias_relu.kg", {"M": 2048, "N": 64, "K": 32}, break_row=1500)
    (check,) = report.checks
    assert check.rows_checked == harness.CHECK_ROWS and check.result.unwritten >= 64
    assert not report.ok and any("rows" in note for note in report.notes)
