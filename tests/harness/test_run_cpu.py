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

    def __init__(self, kernel, break_row=None, wrong=0.0, block=None):
        self.kernel = kernel
        self.break_row = break_row
        self.wrong = wrong
        self.block = block  # a loop's blocks, as the plan's

    def bind(self, **args):
        return args

    def launch(self, bound, stream):
        inputs = {p.name: bound[p.name] for p in self.kernel.params
                  if p.role is ir.Role.IN and p.kind is not ir.ParamKind.SCALAR}
        scalars = {name: value for name, value in bound.items() if np.ndim(value) == 0}
        for name, value in evaluate(self.kernel, inputs, scalars, block=self.block).items():
            out = bound[name]
            out[...] = np.asarray(value).reshape(out.shape)
            if self.break_row is not None and out.ndim == 2:
                out[self.break_row] = np.nan
            elif self.break_row is not None and out.ndim == 4:  # [B, H, rows, cols]
                out[..., self.break_row, :] = np.nan
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
                       compiled=NumpyKernel(built.kernel, block=harness.reference_block(
                           built.plan), **kernel_options))


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


# Tile programs: the same run, the reference whole (every row of every (batch, head)) and a
# loop's in the plan's blocks


def test_attention_runs_and_checks_every_output(cpu_harness):
    sizes = {"B": 2, "H": 4, "HKV": 1, "S": 100, "T": 72}
    report = _run("attention_fwd.kg", sizes)
    assert report.checked and report.ok
    assert {c.name: c.shape for c in report.checks} == {"O": (2, 4, 100, 128),
                                                        "lse": (2, 4, 100)}
    assert all(c.rows_checked is None for c in report.checks)
    assert report.flops == 2 * (2 * 100 * 72 * 128) * 2 * 4  # two gemms per (batch, head)
    assert report.sizes == sizes


def test_a_programs_unwritten_rows_and_wrong_values_fail(cpu_harness):
    sizes = {"B": 1, "H": 2, "HKV": 2, "S": 40, "T": 40}
    unwritten = _run("attention_fwd.kg", sizes, break_row=5)
    o = next(c for c in unwritten.checks if c.name == "O")
    assert not unwritten.ok and o.result.unwritten == 2 * 128
    wrong = _run("attention_fwd.kg", sizes, wrong=10.0)
    assert not wrong.ok


def test_mlp_loop_and_row_kernel_run(cpu_harness):
    mlp = _run("mlp_loop.kg", {"M": 70, "N0": 200})
    assert mlp.ok and [c.shape for c in mlp.checks] == [(70, 128)]
    assert mlp.flops == 2 * 70 * 200 * 256 + 2 * 70 * 128 * 200
    rows = _run("attention_bwd_dot.kg", {"B": 2, "H": 3, "S": 33})
    assert rows.ok and [c.shape for c in rows.checks] == [(2, 3, 33)] and rows.flops == 0


def test_program_sizes_default_heads_like_batches():
    from kgen.harness.inputs import input_scales, resolve_sizes

    kernel = build_file(EXAMPLES / "attention_fwd.kg").kernel
    dims = resolve_sizes(kernel, {"S": 64})
    assert dims == {"B": 4, "H": 4, "S": 64, "HKV": 4, "T": 1024}
    assert input_scales(kernel, dims)["Q"] == pytest.approx(128 ** -0.5)  # K^T: K0 = 128
    assert harness.reference_block(build_file(EXAMPLES / "attention_fwd.kg").plan) == 64
    assert harness.reference_block(build_file(EXAMPLES / "attention_bwd_dot.kg").plan) is None
