"""`kgen run`: compile, launch on random data, check against the reference, benchmark.

Inputs come from harness.inputs (random, never zeros). Outputs are poisoned with NaN before the
launch: an element still NaN afterwards (where the reference is not) was never written. For
large M the reference is computed on a random subset of rows, and the NaN check covers the
whole output.
Tensors are PyTorch's when PyTorch and a GPU are there (and PyTorch is then timed on the same
data as the baseline); kgen's own DeviceBuffers otherwise.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from .. import ir
from ..errors import KgenError
from ..plan import KernelPlan
from ..reference import (CompareResult, checking_dtype, compare, evaluate, needs_all_rows,
                         tolerance)
from ..runtime.device import device_info, require_gpu
from .arrays import BufferArrays, TorchArrays, sync, torch_usable
from .attention_bwd import CAUSAL as BACKWARD_CAUSAL
from .attention_bwd import backward_form, backward_inputs, time_backward_baselines
from ..reference_tiles import rows_param
from .inputs import (batches_of, gemms_of, make_inputs, matrix_shape_of, pick_scalars,
                     resolve_sizes, shape_of)
from .timing import DEFAULT_ITERS, DEFAULT_WARMUP, Timing, rotation_count, time_kernel

CHECK_ROWS = 256  # rows the reference computes when M is large

# Dense f16/bf16 tensor-core peak (FLOP/s) and memory bandwidth (B/s), by device name.
# More specific names first.
_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100 NVL", 835e12, 3.9e12),
    ("H200", 989e12, 4.8e12),
    ("H100", 989e12, 3.35e12),
    ("A100", 312e12, 2.0e12),
    ("L40S", 362e12, 0.864e12),
)


def device_peaks(name: str) -> tuple[float | None, float | None]:
    for key, flops, bandwidth in _PEAKS:
        if key in name:
            return flops, bandwidth
    return None, None


@dataclass(frozen=True, slots=True)
class OutputCheck:
    name: str
    dtype: str
    shape: tuple[int, ...]
    rows_checked: int | None  # None: every row
    result: CompareResult

    def as_dict(self) -> dict:
        r = self.result
        return {
            "name": self.name, "dtype": self.dtype, "shape": list(self.shape),
            "rows_checked": self.rows_checked, "ok": r.ok, "max_abs": r.max_abs,
            "max_rel": r.max_rel, "unwritten": r.unwritten, "bad": r.bad,
            "worst": list(r.worst) if r.worst is not None else None,
            "atol": r.atol, "rtol": r.rtol,
        }


@dataclass
class RunReport:
    kernel: str
    plan_arch: str
    compile_arch: str
    device: str
    sizes: dict[str, int]
    scalars: dict[str, float]
    seed: int
    backend: str  # "torch" or "kgen" (DeviceBuffer)
    compile: dict[str, Any]
    checked: bool = False
    checks: list[OutputCheck] = field(default_factory=list)
    flops: int = 0
    bytes: int = 0
    timing: Timing | None = None
    torch_timing: Timing | None = None
    baselines: dict[str, Timing] = field(default_factory=dict)  # attention: SDPA's, Flex's
    peak_flops: float | None = None
    peak_bandwidth: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.result.ok for c in self.checks)

    def _tflops(self, timing: Timing | None) -> float | None:
        if timing is None or not self.flops or timing.median_ms <= 0:
            return None
        return self.flops / (timing.median_ms * 1e-3) / 1e12

    @property
    def tflops(self) -> float | None:
        return self._tflops(self.timing)

    @property
    def gbps(self) -> float | None:
        if self.timing is None or self.timing.median_ms <= 0:
            return None
        return self.bytes / (self.timing.median_ms * 1e-3) / 1e9

    @property
    def torch_tflops(self) -> float | None:
        return self._tflops(self.torch_timing)

    @property
    def speedup(self) -> float | None:
        """PyTorch's time over kgen's: above 1 means kgen is faster."""
        if self.timing is None or self.torch_timing is None or self.timing.median_ms <= 0:
            return None
        return self.torch_timing.median_ms / self.timing.median_ms

    def speedup_over(self, baseline: Timing) -> float | None:
        """A baseline's time over kgen's: above 1 means kgen is faster."""
        if self.timing is None or self.timing.median_ms <= 0:
            return None
        return baseline.median_ms / self.timing.median_ms

    @property
    def peak_fraction(self) -> float | None:
        if self.tflops is None or not self.peak_flops:
            return None
        return self.tflops * 1e12 / self.peak_flops

    @property
    def bandwidth_fraction(self) -> float | None:
        if self.gbps is None or not self.peak_bandwidth:
            return None
        return self.gbps * 1e9 / self.peak_bandwidth

    def as_dict(self) -> dict:
        return {
            "kernel": self.kernel, "plan_arch": self.plan_arch,
            "compile_arch": self.compile_arch, "device": self.device, "sizes": self.sizes,
            "scalars": self.scalars, "seed": self.seed, "backend": self.backend,
            "compile": self.compile, "checked": self.checked,
            "ok": self.ok if self.checked else None,
            "checks": [c.as_dict() for c in self.checks],
            "flops": self.flops, "bytes": self.bytes,
            "time_ms": self.timing.median_ms if self.timing else None,
            "timing": self.timing.as_dict() if self.timing else None,
            "tflops": self.tflops, "gbps": self.gbps,
            "peak_fraction": self.peak_fraction, "bandwidth_fraction": self.bandwidth_fraction,
            "torch_time_ms": self.torch_timing.median_ms if self.torch_timing else None,
            "torch_tflops": self.torch_tflops, "speedup_vs_torch": self.speedup,
            "baselines": {name: {"time_ms": t.median_ms, "tflops": self._tflops(t),
                                 "speedup": self.speedup_over(t)}
                          for name, t in self.baselines.items()},
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------------------------
# The run


def _rows_for_check(kernel: ir.Kernel, m: int, rng: np.random.Generator) -> np.ndarray | None:
    if needs_all_rows(kernel) or m <= 2 * CHECK_ROWS:
        return None
    picked = rng.choice(m, CHECK_ROWS - 2, replace=False)
    return np.unique(np.concatenate([[0, m - 1], picked]))


def _row_indexed_outputs(kernel: ir.Kernel) -> set[str]:
    """Outputs whose first axis is the output row: tensors, and row reductions ([M])."""
    names = {p.name for p in kernel.params
             if p.role is ir.Role.OUT and p.kind is ir.ParamKind.TENSOR}
    for gemm in kernel.gemms:
        for stmt in gemm.epilogue.reductions:
            if stmt.value.axis is ir.Axis.ROW:
                names.add(stmt.target)
    return names


def _instances(kernel: ir.Kernel, sizes: Mapping[str, int]) -> int:
    """How many times the kernel's matrices are computed: its batches, and for a tile program
    every (batch, head) of the parameter whose rows it computes."""
    if not kernel.is_program:
        return batches_of(kernel, sizes)
    return _lead_count(rows_param(kernel), sizes)


def _lead_count(param: ir.Param, sizes: Mapping[str, int]) -> int:
    """The (batch, head) pairs of a tile program's parameter: its dims before the matrix."""
    lead = param.full_shape[:-len(param.shape)]
    return math.prod(d if isinstance(d, int) else sizes[d] for d in lead)


def work(kernel: ir.Kernel, sizes: Mapping[str, int]) -> tuple[int, int]:
    """FLOPs (2*M*N*K per gemm, a loop's gemms over the whole loop) and bytes (inputs read
    once, outputs written once)."""
    flops = 0
    gemms = gemms_of(kernel)
    m = matrix_shape_of(kernel.param(gemms[0].a.name), sizes)[0] if gemms else 0
    if kernel.loop is not None and len(kernel.loop.gemms) > 2:
        flops = _dag_flops(kernel, sizes, m)
        gemms = ()
    for gemm in gemms:
        b = kernel.param(gemm.b.name)
        k, n = matrix_shape_of(b, sizes)
        if gemm.b.transposed:
            k, n = n, k
        flops += 2 * m * n * k * _instances(kernel, sizes)
    total = 0
    for param in kernel.params:
        if param.kind is ir.ParamKind.SCALAR and param.role is ir.Role.IN:
            continue
        total += math.prod(shape_of(param, sizes)) * param.dtype.nbytes
    return flops, total


def _dag_flops(kernel: ir.Kernel, sizes: Mapping[str, int], rows: int) -> int:
    """A DAG loop's gemms over the whole loop, every block counted (a mask's skipped blocks
    too): each is rows x loop length x its inner or outer width (K of a score gemm, N of the
    others), 2 FLOPs a multiply-add."""
    loop = kernel.loop
    length = sizes[loop.dim] if isinstance(loop.dim, str) else int(loop.dim)
    total = 0
    for gemm in loop.gemms:
        a = kernel.param(gemm.a.name)  # None: a tile value
        score = not gemm.accumulate and a is not None
        width = matrix_shape_of(a if score else kernel.param(gemm.b.name), sizes)[1]
        total += 2 * rows * length * width
    # every (batch, head) of the streamed operand: a GQA backward's rows (K) have fewer heads
    # than the queries it walks
    return total * _lead_count(kernel.param(loop.gemms[0].b.name), sizes)


def kernel_inputs(kernel: ir.Kernel, dims: Mapping[str, int],
                  scalars: Mapping[str, float] | None, rng: np.random.Generator
                  ) -> tuple[dict[str, np.ndarray], dict, list[str]]:
    """A run's host inputs, its scalars' values and the notes on them: random inputs and
    scalars (harness.inputs), but an attention backward's (harness.attention_bwd): its scalars
    the program's defaults (the softmax scale) unless given, and its lse and D derived from
    its Q, K, V and dO."""
    backward = backward_form(kernel)
    if backward is not None:  # the softmax scale as the program writes it, unless given
        scalars = {**{p.name: p.default for p in kernel.params if p.kind is ir.ParamKind.SCALAR
                      and p.role is ir.Role.IN and p.default is not None}, **(scalars or {})}
    values = pick_scalars(kernel, scalars, rng)
    host = make_inputs(kernel, dims, rng)
    notes = backward_inputs(kernel, backward, host, values, rng) if backward is not None else []
    return host, values, notes


def run(
    kernel_ir: ir.Kernel,
    plan: KernelPlan,
    source: str,
    sizes: Mapping[str, int] | None = None,
    check: bool = True,
    bench: bool = False,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    *,
    scalars: Mapping[str, float] | None = None,
    iters: int = DEFAULT_ITERS,
    warmup: int = DEFAULT_WARMUP,
    compare_torch: bool = True,
    use_torch: bool | None = None,
    compiled: Any = None,
    hold: bool = True,
) -> RunReport:
    """Compile `source` (emitted from `plan`), run it once on random data, compare with the
    reference when `check`, time it (and PyTorch doing the same) when `bench`."""
    from ..runtime.device import activate, current_device_id
    from ..runtime.launch import CompiledKernel
    from ..runtime.nvrtc import compile_cubin, fast_entry_options, warn_resources

    say = progress or (lambda message: None)
    if kernel_ir.packed:  # its inputs need offsets vectors this harness does not make
        line = kernel_ir.packed[0]
        raise KgenError(line.loc, f"kgen run does not make packed sequences' inputs yet "
                        f"('packed {line.dim} by {line.offsets}'); call the kernel from Python "
                        "with its offsets (kgen.load, or kgen.attention_varlen)")
    blocks = kernel_ir.loop.blocks if kernel_ir.loop is not None else None
    if blocks is not None:  # its lists: this harness does not make them
        raise KgenError(blocks.loc, f"kgen run does not make a block mask's lists yet "
                        f"('blocks ... by {', '.join(blocks.names)}'); call the kernel from "
                        "Python with its lists (kgen.load, or kgen.attention(block_mask=...))")
    require_gpu("kgen run")
    device_id = current_device_id()
    activate(device_id)
    info = device_info(device_id)
    kernel = kernel_ir

    program = kernel_ir.is_program
    if compiled is None and program:
        from ..runtime.program import CompiledProgram

        say(f"compiling {plan.name} for {info.arch} with NVRTC")
        result = compile_cubin(source, plan.name, info.arch)
        warn_resources(result)
        compiled = CompiledProgram(plan, result.cubin, source=source, compiled=result,
                                   device_id=device_id)
    elif compiled is None:
        say(f"compiling {plan.name} for {info.arch} with NVRTC")
        # the fast entry point; a narrow one compiles on the launch that needs it
        result = compile_cubin(source, plan.name, info.arch,
                               extra_options=fast_entry_options(plan.narrow_kernel))
        warn_resources(result)
        compiled = CompiledKernel(plan, result.cubin, source=source, compiled=result,
                                  device_id=device_id, narrow_compiled=False)
    result = compiled.compiled
    compile_info = {"seconds": result.seconds, "cached": result.cached,
                    **result.resources()} if result is not None else {}

    dims = resolve_sizes(kernel, sizes)
    rng = np.random.default_rng(seed)
    say("making random inputs")
    host, values, notes = kernel_inputs(kernel, dims, scalars, rng)
    flops, nbytes = work(kernel, dims)
    peak_flops, peak_bandwidth = device_peaks(info.name)
    use_torch = torch_usable() if use_torch is None else use_torch
    arrays_api = TorchArrays(device_id) if use_torch else BufferArrays(device_id)
    report = RunReport(
        kernel=plan.name, plan_arch=plan.arch.value, compile_arch=info.arch, device=info.name,
        sizes=dims, scalars=values, seed=seed, backend=arrays_api.name, compile=compile_info,
        flops=flops, bytes=nbytes, peak_flops=peak_flops, peak_bandwidth=peak_bandwidth,
    )
    report.notes += notes
    params = {p.name: p for p in kernel.params}
    outputs = [p for p in kernel.params if p.role is ir.Role.OUT]
    device_args: dict[str, Any] = {name: arrays_api.upload(array, params[name])
                                   for name, array in host.items()}
    for param in outputs:
        device_args[param.name] = arrays_api.empty(shape_of(param, dims), param)
    stream = arrays_api.stream()

    say(f"launching {plan.name}")
    bound = compiled.bind(**device_args, **values)
    compiled.launch(bound, stream)
    sync(stream, f"running {plan.name}")

    if check:
        say("checking against the NumPy reference")
        report.checked = True
        report.checks = _check_outputs(kernel, outputs, device_args, arrays_api, host, values,
                                       dims, rng, report.notes, reference_block(plan),
                                       scaled=is_dag(kernel))

    if bench:
        say("benchmarking")
        _bench(report, kernel, compiled, arrays_api, device_args, outputs, values, dims,
               stream, iters, warmup, info.l2_bytes, compare_torch and use_torch, say, hold)
    return report


def reference_block(plan) -> int | None:
    """The block size the reference evaluates a loop in: the plan's (its result may depend on
    the blocking); None for a gemm kernel or a row kernel."""
    return getattr(plan, "block", None)


def is_dag(kernel: ir.Kernel) -> bool:
    """A loop of more gemms than the forward's two (kgen/plan/loop_dag.py's)."""
    return kernel.loop is not None and len(kernel.loop.gemms) > 2


def _dag_tolerance(kernel: ir.Kernel, name: str, ref: np.ndarray) -> tuple[ir.DType, float]:
    """A DAG loop's output: the operands' dtype's tolerance (its values are sums over the loop
    of products of tiles rounded to it, handed on and staged) at the scale of the whole output
    (the rounding errs relative to the terms, which reach the largest output while a sum may
    cancel to near 0): atol = the dtype's times max(1, max |ref|)."""
    dtype = checking_dtype(kernel, name)
    operand = kernel.param(kernel.loop.gemms[0].a.name).dtype
    if tolerance(operand)[1] > tolerance(dtype)[1]:
        dtype = operand
    finite = np.asarray(ref, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    return dtype, tolerance(dtype)[0] * scale


def _check_outputs(kernel, outputs, device_args, arrays_api, host, scalars, dims, rng,
                   notes, block: int | None = None, scaled: bool = False) -> list[OutputCheck]:
    if kernel.is_program:  # every row of every (batch, head): the reference is whole
        reference = evaluate(kernel, host, scalars, block=block)
        rows = None
    else:
        first_a = kernel.param(kernel.gemms[0].a.name)
        m = matrix_shape_of(first_a, dims)[0]
        rows = _rows_for_check(kernel, m, rng)
        if rows is not None:
            notes.append(f"reference computed on {len(rows)} of {m} rows; every element "
                         "checked for being written")
        reference = evaluate(kernel, host, scalars, rows=rows, batches=batches_of(kernel, dims))
    row_indexed = _row_indexed_outputs(kernel)
    empty = [name for name, size in dims.items() if size == 0]
    if empty:
        notes.append(_empty_note(kernel, dims, empty))
    checks = []
    if scaled:
        notes.append("a loop of several gemms: each output checked with its operands' "
                     "tolerance times max(1, its largest reference value)")
    for param in outputs:
        if param.name not in reference:
            notes.append(f"{param.name} is not written by any epilogue; not checked")
            continue
        full = arrays_api.download(device_args[param.name], param)
        if full.size == 0:
            notes.append(f"{param.name} ({'x'.join(map(str, full.shape))}) has no elements: "
                         "nothing to compare")
            continue
        if param.kind is ir.ParamKind.SCALAR and param.batch is None:
            full = full.reshape(())
        subset = rows is not None and param.name in row_indexed
        got = (full[:, rows] if param.batch is not None else full[rows]) if subset else full
        ref = reference[param.name]
        if scaled:
            dtype, atol = _dag_tolerance(kernel, param.name, ref)
            result = compare(got.reshape(np.shape(ref)), ref, dtype, atol=atol)
        else:
            result = compare(got.reshape(np.shape(ref)), ref, checking_dtype(kernel, param.name))
        if subset and not np.isnan(np.asarray(ref, dtype=np.float64)).any():
            # Rows outside the subset have no reference, but none of them may still be NaN.
            nan_total = int(np.count_nonzero(np.isnan(full.astype(np.float32))))
            if nan_total > result.unwritten:
                extra = nan_total - result.unwritten
                result = dataclasses.replace(result, unwritten=nan_total, bad=result.bad + extra,
                                             ok=False)
        checks.append(OutputCheck(
            name=param.name, dtype=param.dtype.dsl_name, shape=tuple(full.shape),
            rows_checked=None if not subset else len(rows), result=result,
        ))
    return checks


def _empty_note(kernel: ir.Kernel, dims: Mapping[str, int], empty: list[str]) -> str:
    """What a run with a zero size checks: a zero K still gives every output element (the
    accumulator is 0 and goes through the epilogue); a zero M or N leaves tensor outputs empty,
    and reductions over the empty axis hold their op's identity."""
    ks = {_gemm_k_dim(kernel, g) for g in gemms_of(kernel)}
    said = ", ".join(f"{name} = 0" for name in empty)
    if _instances(kernel, dims) == 0:
        return f"{said}: no batches, so nothing to compute or compare"
    if all(name in ks for name in empty):
        return (f"{said}: the accumulator is 0; every output element checked (the epilogue "
                "of a zero acc)")
    return (f"{said}: empty outputs have nothing to compare; reduction outputs over an empty "
            "axis are checked to hold the op's identity")


def _gemm_k_dim(kernel: ir.Kernel, gemm: ir.Gemm):
    return kernel.param(gemm.b.name).shape[1 if gemm.b.transposed else 0]


def rotated_sets(arrays_api, first_set: dict[str, Any], set_bytes: int,
                 l2_bytes: int) -> list[dict[str, Any]]:
    """`first_set` and copies of it, enough that together they exceed twice the L2 (see
    timing.rotation_count): a timed run does not find the previous run's operands in L2."""
    sets = [first_set]
    for _ in range(rotation_count(set_bytes, l2_bytes) - 1):
        sets.append({name: arrays_api.copy(array) for name, array in first_set.items()})
    return sets


def time_compiled(compiled, sets: list[dict[str, Any]], scalars: Mapping[str, float],
                  stream: int, *, iters: int = DEFAULT_ITERS, warmup: int = DEFAULT_WARMUP,
                  hold: bool = True) -> Timing:
    """CUDA-event times of `compiled` launched on the argument `sets` in turn (the median is
    Timing.median_ms). Used by `kgen run --bench` and `kgen tune`."""
    bound = [compiled.bind(**args, **scalars) for args in sets]
    return time_kernel(lambda i: compiled.launch(bound[i], stream), warmup=warmup,
                       iters=iters, rotate=len(sets), stream=stream, hold=hold)


def _bench(report, kernel, compiled, arrays_api, first_set, outputs, scalars, dims, stream,
           iters, warmup, l2_bytes, with_torch, say, hold=True) -> None:
    sets = rotated_sets(arrays_api, first_set, report.bytes, l2_bytes)
    rotate = len(sets)
    report.timing = time_compiled(compiled, sets, scalars, stream, iters=iters, warmup=warmup,
                                  hold=hold)
    if with_torch:
        from .torch_eval import TorchEvaluator

        say("benchmarking PyTorch on the same data")
        evaluators = [TorchEvaluator(kernel, args, scalars) for args in sets]
        try:
            report.torch_timing = time_kernel(lambda i: evaluators[i].run(), warmup=warmup,
                                              iters=iters, rotate=rotate, stream=stream,
                                              hold=hold)
        except Exception as err:  # the baseline is informative; its failure is not kgen's
            report.notes.append(f"PyTorch baseline failed: {type(err).__name__}: {err}")
        from .attention_bench import attention_call, time_baselines

        call = attention_call(kernel, getattr(compiled, "plan", None))
        backward = backward_form(kernel)
        if backward is not None:
            plan = getattr(compiled, "plan", None)
            causal = getattr(getattr(plan, "bounds", None), "bounds", None) == BACKWARD_CAUSAL
            report.baselines, notes = time_backward_baselines(
                backward, causal, sets, lambda fn: time_kernel(
                    fn, warmup=warmup, iters=iters, rotate=rotate, stream=stream, hold=hold),
                say)
            report.notes += notes
        elif call is not None:
            report.baselines, notes = time_baselines(
                call, sets, lambda fn: time_kernel(fn, warmup=warmup, iters=iters,
                                                   rotate=rotate, stream=stream, hold=hold),
                say)
            report.notes += notes
    sync(stream, "benchmark")
