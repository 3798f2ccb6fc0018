"""On a GPU: a kernel writes its outputs and nothing else.

Every argument lives in the middle of a larger byte buffer filled with a sentinel pattern
(MARGIN bytes before and after), and every 2-D tensor has padded rows (a leading dimension
past the row length, so the gap between rows is sentinel too). Each example runs at ragged
sizes; then its outputs must match the NumPy reference, the input buffers must be unchanged
to the bit, and in the output buffers only the output elements may differ from what was
there before the launch. A batched argument's batches are a sentinel gap apart too.

tests/runtime/test_sentinel_checker.py runs the same checker on the CPU (with torch) against
simulated kernels that write one byte too far, so this test is known to be able to fail.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from kgen import ir

EXAMPLES = sorted((Path(__file__).resolve().parent.parent.parent / "examples").glob("*.kg"))
SIZES = [(1000, 1000, 40), (130, 258, 72)]
MARGIN = 4096  # sentinel bytes before and after each argument (keeps 16-byte alignment)
ROW_PAD = 8  # elements past the row length, rounded up to a multiple of 8 (cp.async's 16 B)
BATCH_PAD = 8  # elements past each batch of a batched argument (keeps 16-byte alignment)
SENTINEL = 0x5A  # 0x5A5A is a normal f16/bf16 number, 0x5A5A5A5A a normal f32: not NaN, not 0
POISON = 0xFF  # all-ones bytes are NaN in f16, bf16 and f32: an output element never written


def _torch_dtype(torch, dtype: ir.DType):
    from kgen.runtime.tensors import TORCH_DTYPES

    return getattr(torch, TORCH_DTYPES[dtype])


class Guarded:
    """One argument: a sentinel-filled byte buffer and the logical view in its middle."""

    def __init__(self, torch, param: ir.Param, shape: tuple[int, ...], device):
        self.param = param
        self.shape = shape
        item = param.dtype.nbytes
        # a batched argument: `batches` copies of one batch's elements, `pitch` elements apart;
        # with heads too (a tile program's [B, H, ...]), B x H copies, heads the inner one
        lead = int(param.batch is not None) + int(param.heads is not None)
        self.lead = tuple(shape[:lead])
        self.batches = int(np.prod(self.lead)) if lead else None
        one = shape[lead:]
        if param.kind is ir.ParamKind.TENSOR:
            rows, cols = one
            outer, inner = (rows, cols) if param.layout is ir.Layout.ROW else (cols, rows)
            self.ld = -(-inner // 8) * 8 + ROW_PAD
            self.outer, self.inner = outer, inner
            elements = outer * self.ld
        else:  # a vector, or a scalar output (one element)
            elements = max(int(np.prod(one)), 1)
        self.elements = elements
        if self.batches is not None:
            self.pitch = -(-elements // 8) * 8 + BATCH_PAD
            elements = self.batches * self.pitch
        nbytes = elements * item
        self.nbytes = nbytes
        self.buffer = torch.full((MARGIN + nbytes + MARGIN,), SENTINEL, dtype=torch.uint8,
                                 device=device)
        self.view = self.view_of(torch, self.buffer)
        self.before = None

    def view_of(self, torch, buffer):
        """The argument's elements inside `buffer` (this one or a copy of it)."""
        flat = buffer[MARGIN:MARGIN + self.nbytes].view(_torch_dtype(torch, self.param.dtype))
        if self.batches is not None:
            lead_strides = tuple(int(np.prod(self.lead[i + 1:])) * self.pitch
                                 for i in range(len(self.lead)))
            if self.param.kind is ir.ParamKind.SCALAR:  # one value per batch
                return flat.as_strided(self.lead, lead_strides)
            if self.param.kind is ir.ParamKind.VECTOR:
                return flat.as_strided((*self.lead, self.elements), (*lead_strides, 1))
            view = flat.as_strided((*self.lead, self.outer, self.inner),
                                   (*lead_strides, self.ld, 1))
            return view if self.param.layout is ir.Layout.ROW else view.transpose(-1, -2)
        if self.param.kind is ir.ParamKind.TENSOR:
            view = flat.view(self.outer, self.ld)[:, :self.inner]
            return view if self.param.layout is ir.Layout.ROW else view.t()
        if self.param.kind is ir.ParamKind.SCALAR:
            return flat[:1]
        return flat

    def upload(self, torch, host: np.ndarray) -> None:
        if self.param.dtype in (ir.DType.BF16, ir.DType.F8E4M3, ir.DType.F8E5M2):  # ml_dtypes'
            bits = np.uint16 if self.param.dtype is ir.DType.BF16 else np.uint8
            cpu = torch.from_numpy(np.ascontiguousarray(host).view(bits)).view(
                _torch_dtype(torch, self.param.dtype))
        else:
            cpu = torch.from_numpy(np.ascontiguousarray(host))
        self.view.copy_(cpu.to(self.view.device))

    def poison(self) -> None:
        self.view.fill_(float("nan"))  # the elements only: the row padding keeps the sentinel

    def snapshot(self) -> None:
        self.before = self.buffer.clone()

    def stray_bytes(self, torch, written: bool) -> list[int]:
        """Offsets (from the first element's byte) of bytes that changed but may not have:
        every byte for an input; for an output, every byte outside its elements."""
        expected = self.before.clone()
        if written:
            self.view_of(torch, expected).copy_(self.view)
        changed = (self.buffer != expected).nonzero().flatten()
        return [int(i) - MARGIN for i in changed[:8].cpu()]

    def host(self) -> np.ndarray:
        values = self.view.float().cpu().numpy()
        single = self.param.kind is ir.ParamKind.SCALAR and self.batches is None
        return values.reshape(()) if single else values


def guarded_arguments(torch, kernel: ir.Kernel, sizes: dict, device, seed: int = 0):
    """Sentinel-guarded arguments for every tensor and vector (and scalar output) of `kernel`,
    inputs filled with the random data `kgen run` uses, outputs poisoned; plus the host inputs
    and scalars for the reference."""
    from kgen.harness.inputs import shape_of
    from kgen.harness.run import kernel_inputs

    # as `kgen run` makes them: an attention backward's scale its own, its lse and D derived
    host, scalars, _ = kernel_inputs(kernel, sizes, None, np.random.default_rng(seed))
    guards: dict[str, Guarded] = {}
    for param in kernel.params:
        if param.kind is ir.ParamKind.SCALAR and param.role is ir.Role.IN:
            continue
        guard = Guarded(torch, param, shape_of(param, sizes), device)
        if param.role is ir.Role.IN:
            guard.upload(torch, host[param.name])
        else:
            guard.poison()
        guards[param.name] = guard
    return guards, host, scalars


def check_guards(torch, kernel: ir.Kernel, guards: dict, host: dict, scalars: dict) -> list[str]:
    """Every problem found after the launch: outputs that differ from the reference, bytes
    that changed outside the outputs."""
    from kgen.reference import checking_dtype, compare, evaluate

    problems = []
    reference = evaluate(kernel, host, scalars)
    for name, guard in guards.items():
        output = guard.param.role is ir.Role.OUT
        stray = guard.stray_bytes(torch, written=output)
        if stray:
            what = "outside the output" if output else "in an input"
            problems.append(f"{name}: bytes changed {what}, at offsets {stray} (first element "
                            f"at 0; {guard.nbytes} bytes of elements and row padding)")
        if output and name in reference:
            ref = reference[name]
            result = compare(guard.host().reshape(np.shape(ref)), ref,
                             checking_dtype(kernel, name))
            if not result.ok:
                problems.append(f"{name}: {result.summary()}")
    return problems


def sizes_of(kernel: ir.Kernel, mnk) -> dict:
    from kgen.harness.inputs import resolve_sizes, symbolic_dims

    m, n, k = mnk
    # a tile program's rows and loop length take M and N (attention's S and T, the MLP's N0;
    # the MLP streams its column-major W1 along N0 in 16-byte chunks: N0 a multiple of 8)
    wanted = dict(M=m, N=n, K=k, S=m, T=n, N0=-(-n // 8) * 8)
    return resolve_sizes(kernel, {d: v for d, v in wanted.items() if d in symbolic_dims(kernel)})


@functools.lru_cache(maxsize=None)
def _compiled(example: Path, arch: str | None):
    from kgen.api import build_file, load_built

    built = build_file(example, arch)
    return built, load_built(built)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", [None, "sm_90a"], ids=["own", "sm_90a"])
@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_outputs_only_are_written(example, mnk, arch):
    torch = pytest.importorskip("torch")
    if arch == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    from kgen.errors import KgenError

    try:
        built, compiled = _compiled(example, arch)
    except KgenError as err:  # an example that does not plan for sm_90a (golden has none)
        pytest.skip(f"{example.stem} does not plan for {arch}: {err}")
    kernel = built.kernel
    if kernel.packed:  # `kgen run` refuses them too (tests/gpu/test_run_gpu.py)
        pytest.skip(f"{example.stem}: packed sequences take offsets vectors this test does "
                    "not make (tests/gpu/test_attention_varlen*_gpu.py check them)")
    sizes = sizes_of(kernel, mnk)
    guards, host, scalars = guarded_arguments(torch, kernel, sizes, "cuda")
    torch.cuda.synchronize()
    for guard in guards.values():
        guard.snapshot()
    compiled(**{name: guard.view for name, guard in guards.items()}, **scalars)
    torch.cuda.synchronize()
    problems = check_guards(torch, kernel, guards, host, scalars)
    assert not problems, f"{example.stem} at {sizes}:\n" + "\n".join(problems)
