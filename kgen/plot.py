"""Pictures, with matplotlib (the optional extra `kgen[plot]`): the candidates of `kgen tune`
and the roofline of `kgen run --bench`. Figures are drawn on matplotlib's Agg canvas, never
through pyplot, so nothing global changes in a process that uses matplotlib itself."""
from __future__ import annotations

import os

from .errors import KgenRuntimeError

MISSING = "--plot needs matplotlib: pip install 'kgen[plot]' (or pip install matplotlib)"


def require_matplotlib() -> None:
    """Raise KgenRuntimeError (an environment problem: exit 1) when matplotlib is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise KgenRuntimeError(MISSING)


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str | os.PathLike) -> None:
    try:
        figure.savefig(path, dpi=120)
    except OSError as err:
        raise KgenRuntimeError(f"cannot write {path}: {err.strerror or err}") from None


def candidates_chart(report, path: str | os.PathLike) -> None:
    """`kgen tune --plot`: each timed candidate's median time, fastest at the top; the winner
    and the builder's own choice marked."""
    rows = sorted(report.timed_rows, key=lambda r: r.ms)
    if not rows:
        raise KgenRuntimeError("--plot: no candidate was timed")
    figure = _figure(9, 1.2 + 0.28 * len(rows))
    axes = figure.add_subplot()
    labels, times, colors = [], [], []
    for row in reversed(rows):
        mark = " (builder)" if row.candidate.default else ""
        labels.append(row.candidate.label + mark)
        times.append(row.ms)
        colors.append("tab:green" if row is report.winner else
                      "tab:orange" if row.candidate.default else "tab:blue")
    axes.barh(range(len(rows)), times, color=colors)
    axes.set_yticks(range(len(rows)), labels, fontsize=7)
    axes.set_xlabel("median time (ms)")
    sizes = ", ".join(f"{k}={v}" for k, v in report.sizes.items())
    axes.set_title(f"kgen tune {report.kernel} ({report.arch}) at {sizes} on {report.device}",
                   fontsize=9)
    _save(figure, path)


def roofline(report, path: str | os.PathLike) -> None:
    """`kgen run --bench --plot`: the device's roof (peak tensor-core FLOP/s, memory
    bandwidth) and the kernel's point; PyTorch's point at the same work, when it was timed."""
    if report.tflops is None or not report.bytes:
        raise KgenRuntimeError("--plot: the run has no timing (add --bench)")
    intensity = report.flops / report.bytes
    figure = _figure(7, 4.5)
    axes = figure.add_subplot()
    axes.set_xscale("log")
    axes.set_yscale("log")
    low, high = intensity / 100, intensity * 100
    if report.peak_flops and report.peak_bandwidth:
        ridge = report.peak_flops / report.peak_bandwidth
        low, high = min(low, ridge / 10), max(high, ridge * 10)
        xs = [low, ridge, high]
        ys = [low * report.peak_bandwidth / 1e12, report.peak_flops / 1e12,
              report.peak_flops / 1e12]
        axes.plot(xs, ys, color="black", label=f"{report.device} roof")
    else:
        axes.set_title(f"no peak figures known for {report.device}: points only", fontsize=8)
    axes.scatter([intensity], [report.tflops], color="tab:green", zorder=3,
                 label=f"kgen {report.kernel}: {report.tflops:.1f} TFLOP/s")
    if report.torch_tflops is not None:
        axes.scatter([intensity], [report.torch_tflops], color="tab:red", marker="s", zorder=3,
                     label=f"PyTorch: {report.torch_tflops:.1f} TFLOP/s")
    axes.set_xlim(low, high)
    axes.set_xlabel("arithmetic intensity (FLOP per byte of inputs and outputs)")
    axes.set_ylabel("TFLOP/s")
    sizes = ", ".join(f"{k}={v}" for k, v in report.sizes.items())
    figure.suptitle(f"{report.kernel} at {sizes}", fontsize=9)
    axes.legend(fontsize=8, loc="lower right")
    _save(figure, path)
