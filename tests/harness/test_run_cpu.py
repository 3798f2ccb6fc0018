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


# The attention backward (a DAG loop): inputs that belong together, every output checked


def test_attention_backward_runs_with_derived_lse_and_d(cpu_harness):
    sizes = {"B": 1, "H": 2, "S": 70, "T": 45}
    report = _run("attention_bwd.kg", sizes)
    assert report.checked and report.ok, [c.as_dict() for c in report.checks]
    assert {c.name: c.shape for c in report.checks} == {
        "dQ": (1, 2, 70, 128), "dK": (1, 2, 45, 128), "dV": (1, 2, 45, 128)}
    assert report.flops == 5 * 2 * 45 * 70 * 128 * 2  # five gemms per (batch, head)
    assert report.scalars == {"scale": 0.08838834764}  # the program's, not a random one
    assert any("log-sum-exp of the program's own scores" in n for n in report.notes)
    wrong = _run("attention_bwd.kg", sizes, wrong=0.5)
    assert not wrong.ok
    unwritten = _run("attention_bwd.kg", sizes, break_row=3)
    assert not unwritten.ok


def test_backward_inputs_are_an_attentions():
    """lse makes P's columns sum to 1 under the program's causal mask (a query before every
    key sees none: lse = +inf), and D = rowsum(dO * O) with O = P V."""
    from kgen.harness.attention_bwd import backward_form, backward_inputs
    from kgen.harness.inputs import make_inputs

    kernel = build_file(EXAMPLES / "attention_bwd.kg").kernel
    form = backward_form(kernel)
    assert (form.q, form.k, form.v, form.do, form.lse, form.d, form.p) == (
        "Q", "K", "V", "dO", "lse", "D", "pt")
    dims = {"B": 2, "H": 1, "S": 20, "T": 30}
    rng = np.random.default_rng(3)
    host = make_inputs(kernel, dims, rng)
    notes = backward_inputs(kernel, form, host, {"scale": 0.125}, rng)
    assert "standard normal" in notes[0]
    q, k, v, do = (np.asarray(host[n], np.float64) for n in ("Q", "K", "V", "dO"))
    for b in range(2):
        x = 0.125 * q[b, 0] @ k[b, 0].T  # [queries, keys]
        keep = np.arange(30)[None, :] <= np.arange(20)[:, None]  # key <= query
        x = np.where(keep, x, -np.inf)
        lse = np.log(np.exp(x).sum(1))
        np.testing.assert_allclose(host["lse"][b, 0], lse, rtol=1e-6)
        p = np.exp(x - lse[:, None])
        np.testing.assert_allclose(host["D"][b, 0], (do[b, 0] * (p @ v[b, 0])).sum(1),
                                   rtol=1e-5, atol=1e-6)


def test_backward_inputs_fall_back_when_the_value_is_not_exp_of_minus_lse():
    import dataclasses

    from kgen.harness.attention_bwd import backward_form, backward_inputs
    from kgen.harness.inputs import make_inputs
    from kgen.parse import parse

    text = (EXAMPLES / "attention_bwd.kg").read_text().replace(
        "exp(scale * acc - lse[col])", "exp(scale * acc) - lse[col]")
    kernel = parse(text, "t.kg").kernels[0]
    form = backward_form(kernel)
    assert form is not None
    rng = np.random.default_rng(0)
    host = make_inputs(kernel, {"B": 1, "H": 1, "S": 8, "T": 8}, rng)
    before = np.array(host["lse"])
    notes = backward_inputs(kernel, form, host, {"scale": 0.1}, rng)
    assert "not derived" in notes[0] and "exp(-lse[col])" in notes[0]
    assert np.array_equal(host["lse"], before)
    assert dataclasses.replace(form, d="D") == form


def test_other_dag_loops_are_no_attention_backward():
    from kgen.harness.attention_bwd import backward_form

    assert backward_form(build_file(EXAMPLES / "attention_fwd.kg").kernel) is None
    assert backward_form(build_file(EXAMPLES / "mlp_loop.kg").kernel) is None


def test_dag_flops_count_every_query_head_of_a_gqa_backward():
    """A GQA backward's rows (K, V) have fewer heads than the queries its loop walks: its FLOPs
    count every (batch, query head), as the MHA backward's do."""
    from kgen.harness.run import work
    from kgen.parse import parse
    from kgen.verify import verify
    from tests.test_backward_gqa import TEXT, gqa_text

    def flops(text: str, sizes: dict) -> int:
        module = parse(text, "<t>")
        verify(module)
        return work(module.kernels[0], sizes)[0]

    sizes = {"B": 2, "H": 8, "S": 256, "T": 256}
    mha = flops(TEXT, sizes)
    gqa = flops(gqa_text(), {**sizes, "HKV": 2})
    assert mha == gqa == 2 * 8 * 256 * 256 * 2 * 5 * 128
