"""The attention backward's own launcher (the .cu's host code, built with nvcc; no GPU needed):
it refuses the arguments kgen's runtime refuses, with its reasons, and zeroes dQ (the `out
accumulate` tensor) before the main kernel. tests/gpu/test_attention_bwd_launcher_gpu.py runs
it on a GPU."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kgen.api import build_file
from kgen.enums import DType
from kgen.errors import ArgumentError
from kgen.runtime.program import bind_program

from tests.kernels import run_host_probe
from tests.runtime.test_program_binding import arr

NVCC = shutil.which("nvcc")
PROGRAM = Path(__file__).resolve().parent.parent / "examples" / "attention_bwd.kg"
B, H, S, T, D = 2, 3, 100, 70, 128
MIB = 1 << 20


def _contiguous(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= extent
    return tuple(strides)


def _case(changes: dict) -> dict:
    """name -> (shape, dtype, strides, address) of every argument: contiguous at 1 MiB-aligned
    addresses, with `changes` (name -> (row stride or None, byte offset of the address))."""
    shapes = {"Q": (B, H, S, D), "K": (B, H, T, D), "V": (B, H, T, D), "dO": (B, H, S, D),
              "lse": (B, H, S), "D": (B, H, S), "dQ": (B, H, S, D), "dK": (B, H, T, D),
              "dV": (B, H, T, D)}
    dtypes = {"lse": DType.F32, "D": DType.F32, "dQ": DType.F32}
    args = {}
    for i, (name, shape) in enumerate(shapes.items()):
        ld, offset = changes.get(name, (None, 0))
        strides = _contiguous(shape if ld is None else (*shape[:-1], ld))
        args[name] = (shape, dtypes.get(name, DType.BF16), strides, (i + 1) * 64 * MIB + offset)
    return args


CASES = {  # name -> changes, as _case takes them
    "good": {},
    "padded_rows": {"Q": (136, 0), "dQ": (132, 0)},  # 272 and 528 bytes: 16-byte multiples
    "dq_misaligned": {"dQ": (None, 4)},
    "dq_row_stride": {"dQ": (130, 0)},
    "q_row_stride": {"Q": (132, 0)},
    "k_misaligned": {"K": (None, 2)},
}


def _fields(args: dict) -> dict[str, int]:
    """The params struct's values for `args` (GQA group 1)."""
    values = {}
    for name, (shape, _, strides, address) in args.items():
        values[name] = address
        if len(shape) == 4:
            values[f"{name}_ld"] = strides[2]
        values[f"{name}_bs"], values[f"{name}_hs"] = strides[0], strides[1]
    values.update(scale=0.125, rows=T, loop_len=S, heads=H, group=1, batches=B)
    return values


def _probe(plan) -> list[str]:
    lines = []
    extra = {"negative_rows": {"rows": -1}, "no_group": {"group": 0},
             "group_not_dividing": {"group": 2}}
    cases = {name: _fields(_case(changes)) for name, changes in CASES.items()}
    cases.update({name: {**cases["good"], **over} for name, over in extra.items()})
    for name, values in cases.items():
        lines.append("{")
        lines.append(f"  {plan.name}_params p{{}};")
        for f in plan.fields:
            value = values[f.name]
            if f.name in {"Q", "K", "V", "dO", "lse", "D", "dQ", "dK", "dV"}:
                lines.append(f"  p.{f.name} = reinterpret_cast<decltype(p.{f.name})>"
                             f"(0x{value:x}ull);")
            else:
                lines.append(f"  p.{f.name} = {value};")
        lines.append(f"  const char* why = {plan.name}_cfg::params_reason(p);")
        lines.append(f'  std::printf("{name}|%s\\n", why ? why : "");')
        lines.append("}")
    lines.append(f"  const char* device = {plan.name}_cfg::device_reason();")
    lines.append('  std::printf("device|%s\\n", device ? device : "");')
    return lines


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc on PATH")
def test_the_launcher_refuses_what_the_runtime_refuses(tmp_path):
    built = build_file(PROGRAM)
    plan = built.plan
    (tmp_path / "k.cu").write_text(built.source)
    printed = run_host_probe(tmp_path, ['#include "k.cu"'], _probe(plan), "sm_80")
    for name, changes in CASES.items():
        args = {n: arr(shape, dtype, strides, address)
                for n, (shape, dtype, strides, address) in _case(changes).items()}
        try:
            bound = bind_program(plan, args)
            python = ""
        except ArgumentError as err:
            python = str(err)
        assert bool(printed[name]) == bool(python), (name, printed[name], python)
        if not python:  # the struct the runtime packs is the one the probe wrote
            values = dict(zip([f.name for f in plan.fields], bound.values))
            assert {k: v for k, v in values.items() if k != "scale"} == {
                k: v for k, v in _fields(_case(changes)).items() if k != "scale"}, name
    assert printed["dq_misaligned"] == ("dQ's address must be 16-byte aligned (the kernel "
                                        "copies 16-byte chunks)")
    assert printed["dq_row_stride"].startswith("dQ's strides must be multiples of 16 bytes")
    assert printed["q_row_stride"].startswith("Q's strides must be multiples of 16 bytes")
    assert printed["negative_rows"] == "a size is negative"
    assert printed["no_group"].startswith("the query heads (p.heads) must be a multiple")
    assert printed["group_not_dividing"] == printed["no_group"]
    if not Path("/dev/nvidia0").exists():  # no GPU here: the launcher says so, launches nothing
        assert printed["device"]


def test_the_launcher_zeroes_dq_before_the_main_kernel():
    """In the launcher: the checks, then `<name>_zero` on the same stream (its grid the
    runtime's: kgen/targets/common/loop_dag.zero_grid), then the main kernel by
    `<name>_launch_zeroed` (which a sequence whose row kernel zeroes dQ calls alone)."""
    from kgen.targets.common.loop_dag import ZERO_ROWS, ZERO_THREADS

    source = build_file(PROGRAM).source
    launcher = source[source.index("cudaError_t attention_bwd_launch("):]
    order = [launcher.index(text) for text in (
        "if (params_reason(p) != nullptr) return cudaErrorInvalidValue;",
        "attention_bwd_zero<<<zero_grid, kZeroThreads, 0, stream>>>(p);",
        "return attention_bwd_launch_zeroed(p, stream);")]
    assert order == sorted(order)
    alone = source[source.index("cudaError_t attention_bwd_launch_zeroed("):]
    alone = alone[:alone.index("\n}\n")]
    assert "attention_bwd<<<grid, kThreads, kSmemBytes, stream>>>(p);" in alone
    assert "_zero<<<" not in alone
    assert re.search(rf"constexpr int kZeroRows = {ZERO_ROWS};", source)
    assert re.search(rf"constexpr int kZeroThreads = {ZERO_THREADS};", source)
    assert ("zero_grid((p.loop_len + kZeroRows - 1) / kZeroRows, p.heads, p.batches)"
            in launcher)
