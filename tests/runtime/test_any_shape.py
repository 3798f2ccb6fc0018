"""Any M, N, K on contiguous tensors: both launchers accept them, on the host, with no GPU.

The one-gemm examples, compiled for sm_80 and for sm_90a, take every size of the shapes issue.
Arguments that miss the fast entry point's alignment or size rules run the narrow one, and the
Python launcher (bind_arguments) and the .cu's own launcher (params_reason / narrow_reason,
built with nvcc on the host) make the same choice, for the same reason. Without nvcc (CI), the
same two functions, cut out of the .cu, are built with the host's C++ compiler."""
from __future__ import annotations

import functools
import shutil
from pathlib import Path

import numpy as np
import pytest

from kgen import api
from kgen.enums import Layout, ParamKind
from kgen.plan import FieldKind
from kgen.runtime.launch import bind_arguments
from kgen.runtime.tensors import numpy_dtype

from tests.kernels import run_host_probe

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KERNELS = ("gemm", "gemm_bias_relu", "evt_multi_output")
ARCHS = ("sm_80", "sm_90a")
# M x N x K, the shapes issue's list
SIZES = [(1, 1, 1), (1, 1, 16), (4097, 129, 72), (1000, 1000, 100), (33, 4090, 4090),
         (7, 13, 9), (2, 8192, 3)]
BASE = 0x7F00_0000_0000  # each array at its own 1 MiB-aligned fake address


class Fake:
    """A contiguous device array as __cuda_array_interface__ describes it (never read)."""

    def __init__(self, shape, typestr, layout, ptr):
        itemsize = np.dtype(typestr).itemsize
        if len(shape) == 2 and layout is Layout.COL:
            strides = (itemsize, max(shape[0], 1) * itemsize)
        elif len(shape) == 2:
            strides = (max(shape[1], 1) * itemsize, itemsize)
        else:
            strides = None
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "strides": strides, "version": 3}


@functools.cache
def _built(kernel: str, arch: str):
    return api.build_file(EXAMPLES / f"{kernel}.kg", arch)


def _extents(p, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else sizes[d] for d in p.shape)


def _args(plan, sizes: dict[str, int]) -> dict:
    args = {}
    for i, p in enumerate(plan.params):
        if p.kind is ParamKind.SCALAR and p.role.value == "in":
            continue
        shape = _extents(p, sizes) if p.kind is not ParamKind.SCALAR else (1,)
        args[p.name] = Fake(shape, numpy_dtype(p.dtype), p.layout, BASE + (i + 1) * 2**20)
    return args


def _python_choice(plan, sizes) -> str:
    bound = bind_arguments(plan, _args(plan, sizes), device_of=lambda ptr: None)
    return bound.narrow


def _expected_narrow(plan, m, n, k) -> bool:
    """What the rules say: a 16-bit operand or output whose rows are not 16-byte multiples
    apart, or an odd N, runs the narrow entry point."""
    return k % 8 != 0 or n % 2 != 0 or (
        any(a.ld_multiple == 8 for a in plan.alignments
            if plan.param(a.param).role.value == "out") and n % 8 != 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_size_binds(kernel, arch):
    plan = _built(kernel, arch).plan
    assert plan.narrow_kernel == f"{plan.name}_narrow"
    for m, n, k in SIZES:
        why = _python_choice(plan, {"M": m, "N": n, "K": k})
        assert bool(why) == _expected_narrow(plan, m, n, k), (m, n, k, why)


def test_aligned_sizes_keep_the_fast_entry_point():
    plan = _built("gemm_bias_relu", "sm_90a").plan
    assert _python_choice(plan, {"M": 4096, "N": 4096, "K": 4096}) == ""
    why = _python_choice(plan, {"M": 4096, "N": 4096, "K": 100})
    assert why == ("A's leading dimension 100 is not a multiple of 8: the copy engine (TMA) "
                   "loads it, in rows of 16-byte multiples")


# ---- the .cu's launcher: params_reason and narrow_reason, built with nvcc for the host ----

NVCC = shutil.which("nvcc")


def _field_value(plan, f, sizes: dict[str, int], index: int) -> str:
    if f.kind is FieldKind.POINTER or f.kind is FieldKind.WORKSPACE:
        return f"reinterpret_cast<decltype(p.{f.name})>(0x{BASE + (index + 1) * 2**20:x}ull)"
    if f.kind is FieldKind.SIZE:
        return str(sizes[f.dim])
    if f.kind is FieldKind.LEADING_DIM:
        p = plan.param(f.param)
        rows, cols = _extents(p, sizes)
        return str(max(cols if p.layout is Layout.ROW else rows, 1))
    return "1.0f"


def _probe(plan, index: int) -> list[str]:
    """C++ lines printing, per size, params_reason and narrow_reason of the .cu's launcher."""
    ns = f"{plan.name}_kgen"
    lines = []
    for m, n, k in SIZES:
        sizes = {"M": m, "N": n, "K": k}
        lines.append("{")
        lines.append(f"  {plan.name}_params p{{}};")
        for f in plan.fields:
            lines.append(f"  p.{f.name} = {_field_value(plan, f, sizes, index)};")
        lines.append(f'  const char* hard = {ns}::params_reason(p);')
        lines.append(f'  const char* narrow = {ns}::narrow_reason(p);')
        lines.append(f'  std::printf("{plan.name} {m}x{n}x{k}|%s|%s\\n", hard ? hard : "", '
                     'narrow ? narrow : "");')
        lines.append("}")
    return lines


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc on PATH")
@pytest.mark.parametrize("arch", ARCHS)
def test_the_cu_launcher_makes_the_same_choice(arch, tmp_path):
    body, includes = [], []
    plans = []
    for i, kernel in enumerate(KERNELS):
        built = _built(kernel, arch)
        (tmp_path / f"{kernel}.cu").write_text(built.source)
        includes.append(f'#include "{kernel}.cu"')
        body += _probe(built.plan, i)
        plans.append(built.plan)
    printed = run_host_probe(tmp_path, includes, body, arch)
    for plan in plans:
        for m, n, k in SIZES:
            hard, narrow = printed[f"{plan.name} {m}x{n}x{k}"].split("|")
            assert hard == "", (plan.name, m, n, k, hard)
            python = _python_choice(plan, {"M": m, "N": n, "K": k})
            # the same rule refused first: the .cu says "the leading dimension of A must be
            # a multiple of 8 elements: ...", Python "A's leading dimension 100 is not ..."
            assert bool(narrow) == bool(python), (plan.name, m, n, k, narrow, python)
            if narrow:
                assert narrow.split(": ", 1)[1] == python.split(": ", 1)[1], (narrow, python)


# ---- the same checks built with the host's C++ compiler (CI has no nvcc) ----
GXX = shutil.which("g++") or shutil.which("c++")


def _host_checks_text(source: str, plan) -> str:
    """The .cu's params struct and its {ns}::params_reason / narrow_reason, cut out as plain C++
    (the 16-bit element types are stubbed once for every kernel): the text can_implement and
    the launcher run."""
    start = source.index(f"struct {plan.name}_params {{")
    struct = source[start:source.index("};", start) + 2]
    functions = []
    for name in ("params_reason", "narrow_reason"):
        head = source.index(f"static const char* {name}(const {plan.name}_params& p) {{")
        functions.append(source[head:source.index("\n}\n", head) + 3])
    return "\n".join([struct, f"namespace {plan.name}_kgen {{", *functions, "}"])


@pytest.mark.skipif(GXX is None, reason="needs a C++ compiler on PATH")
@pytest.mark.parametrize("arch", ARCHS)
def test_the_emitted_checks_accept_every_size(arch, tmp_path):
    """The emitted can_implement's argument checks (params_reason) accept every size of the
    shapes issue, and narrow_reason picks the entry point Python picks: the .cu's own text,
    compiled by the host compiler, without nvcc or a GPU."""
    import subprocess

    parts = ["#include <cstdio>", "struct __half { unsigned short x; };",
             "struct __nv_bfloat16 { unsigned short x; };"]
    body, plans = [], []
    for i, kernel in enumerate(KERNELS):
        built = _built(kernel, arch)
        parts.append(_host_checks_text(built.source, built.plan))
        body += _probe(built.plan, i)
        plans.append(built.plan)
    (tmp_path / "probe.cpp").write_text("\n".join(
        [*parts, "int main() {", *body, "  return 0;", "}", ""]))
    build = subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror", "probe.cpp", "-o", "probe"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, timeout=60)
    printed = dict(line.split("|", 1) for line in run.stdout.splitlines())
    assert len(printed) == len(KERNELS) * len(SIZES)
    for plan in plans:
        for m, n, k in SIZES:
            hard, narrow = printed[f"{plan.name} {m}x{n}x{k}"].split("|")
            assert hard == "", (plan.name, m, n, k, hard)
            assert bool(narrow) == _expected_narrow(plan, m, n, k), (plan.name, m, n, k, narrow)
