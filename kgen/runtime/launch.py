"""A compiled kernel you can call: argument checks, the parameter struct, the launch.

`bind_arguments` is a pure function of the plan and the arguments (no GPU needed): it checks
every argument and builds the values of the `<kernel>_params` struct. `CompiledKernel` loads the
cubin and launches with the struct as the kernel's single `__grid_constant__` argument.

cuda.core's `launch()` only takes scalars, pointers and Buffers as kernel arguments (a ctypes
Structure is refused with TypeError in 1.2), so the launch goes through the driver:
`cuLaunchKernel(..., kernelParams=<address of a void*[1] pointing at the struct>)`.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..enums import Layout, ParamKind, Role
from ..errors import ArgumentError, KgenRuntimeError
from ..plan import FieldKind, KernelPlan, Param
from .calls import CallPath
from .entries import allow_smem, compile_narrow, function_of
from .outputs import infer_sizes, output_shapes
from .tensors import TORCH_DTYPES, DeviceArray, as_device_array

# Sizes are int in the params struct and the kernel's index math adds a tile to them and turns
# a column count into bytes (x2), so every size stays below 2**30; offsets are 64-bit.
MAX_SIZE = 2**30 - 1
MAX_GRID = 2**31 - 1  # CTAs in gridDim.x

_SCALAR_CTYPES = {
    "int": ctypes.c_int32,
    "int32_t": ctypes.c_int32,
    "unsigned": ctypes.c_uint32,
    "unsigned int": ctypes.c_uint32,
    "long long": ctypes.c_int64,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    # a tile program's members (kgen/plan/program.py ProgramField.ctype)
    "ptr": ctypes.c_void_p,
    "i64": ctypes.c_int64,
    "i32": ctypes.c_int32,
    "f32": ctypes.c_float,
}


def ctype_of(ctype: str):
    """The ctypes type of a params-struct member's C++ type."""
    text = " ".join(ctype.replace("const ", " ").split())
    if text.endswith("*"):
        return ctypes.c_void_p
    if text in _SCALAR_CTYPES:
        return _SCALAR_CTYPES[text]
    raise KgenRuntimeError(f"the runtime cannot pass a params member of C++ type {ctype!r}")


def params_struct(plan: KernelPlan) -> type[ctypes.Structure]:
    """A ctypes.Structure with the members of `<kernel>_params`, in order (same C layout)."""
    members = [(f.name, ctype_of(f.ctype)) for f in plan.fields]
    return type(f"{plan.name}_params", (ctypes.Structure,), {"_fields_": members})


@dataclass(frozen=True, slots=True)
class BoundArguments:
    """Checked arguments, ready to launch."""

    values: dict[str, int | float]  # params-struct member -> value, in member order
    sizes: dict[str, int]  # every symbolic dimension
    arrays: dict[str, DeviceArray]
    scalars: dict[str, float]
    grid: tuple[int, int, int]
    # Why these arguments run the plan's narrow entry point (they miss the fast one's alignment
    # or size rules), or "" for the fast one
    narrow: str = ""
    owners: tuple[Any, ...] = field(default=(), repr=False)  # keeps the tensors alive


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _decl_text(param: Param) -> str:
    return f"{param.dtype.dsl_name}{_shape_text(param.full_shape)}"


def _is_number(value: Any) -> bool:
    if isinstance(value, (int, float)):
        return True
    try:
        import numpy as np

        return isinstance(value, (np.integer, np.floating)) and np.ndim(value) == 0
    except ImportError:  # pragma: no cover
        return False


def _takes_array(param) -> bool:
    """Whether the call passes an array for `param` (a gemm's Param or a tile program's
    ProgramParam, whose kind is a word)."""
    if isinstance(param.kind, str):
        return param.kind != "scalar"
    return param.kind is not ParamKind.SCALAR or param.role is Role.OUT


def check_positive(name: str, value: float) -> None:
    """A scalar declared `positive` (ir.Param.positive) takes a value > 0 (not NaN): the
    compiled code relies on it."""
    if not value > 0:
        raise ArgumentError(f"scalar {name} is declared positive, so it must be > 0; got "
                            f"{value!r}")


def bind_arguments(
    plan: KernelPlan,
    args: Mapping[str, Any],
    *,
    sizes: Mapping[str, int] | None = None,
    device_id: int | None = None,
    device_of=None,
    persistent_ctas: int | None = None,
    persistent_clusters: int | None = None,
) -> BoundArguments:
    """Check `args` against the kernel's parameters and compute the params-struct values.

    Raises ArgumentError, naming the argument, for: a missing or unknown argument, a wrong
    dtype, rank or fixed dimension, symbolic sizes that disagree between arguments, a 2-D
    tensor not stored in its declared layout with a unit stride, a misaligned pointer or
    leading dimension, a tensor on another device than `device_id`, a size above 2**30-1 or
    not a multiple the plan's `dim_rules` ask for; the alignment and size rules only where the
    plan has no narrow entry point (`narrow` then says why it runs). `persistent_ctas` caps the grid of a
    persistent plan (the device's SM count x resident CTAs per SM; see plan.grid), and
    `persistent_clusters` that of a plan on clusters (its fast entry point; plan.cluster_grid).
    """
    params = {p.name: p for p in plan.params}
    unknown = [name for name in args if name not in params]
    if unknown:
        raise ArgumentError(
            f"unknown argument {unknown[0]!r}; {plan.name} takes "
            + ", ".join(p.name for p in plan.params)
        )

    arrays: dict[str, DeviceArray] = {}
    scalars: dict[str, float] = {}
    for param in plan.params:
        given = param.name in args and args[param.name] is not None
        if _takes_array(param):
            if not given:
                raise ArgumentError(f"missing argument {param.name} ({_decl_text(param)})")
            value = args[param.name]
            if _is_number(value):
                raise ArgumentError(
                    f"{param.name} is a {param.kind.value} {_decl_text(param)}; got the number "
                    f"{value!r}"
                )
            arrays[param.name] = as_device_array(value, param.name, device_of=device_of)
        else:
            if given:
                value = args[param.name]
                if not _is_number(value):
                    raise ArgumentError(
                        f"{param.name} is a scalar; pass a number, got {type(value).__name__}"
                    )
                scalars[param.name] = float(value)
            elif param.default is not None:
                scalars[param.name] = float(param.default)
            else:
                raise ArgumentError(f"missing scalar {param.name} (it has no default)")
            if param.positive:
                check_positive(param.name, scalars[param.name])

    # Dtypes, ranks, devices.
    for name, array in arrays.items():
        param = params[name]
        if array.dtype is not param.dtype:
            raise ArgumentError(
                f"{name} must be {param.dtype.dsl_name} but is {array.describe_dtype()}"
            )
        if device_id is not None and array.device_id is not None and array.device_id != device_id:
            raise ArgumentError(
                f"{name} is on cuda:{array.device_id} but the kernel runs on cuda:{device_id}"
            )

    resolved = _infer_sizes(plan.params, arrays, sizes or {})
    for dim in [f.dim for f in plan.fields if f.kind is FieldKind.SIZE and f.dim]:
        if dim not in resolved:
            raise ArgumentError(
                f"cannot tell the size {dim}: no argument has it; pass sizes={{{dim!r}: ...}}"
            )
    for dim, extent in resolved.items():
        if extent > MAX_SIZE:
            raise ArgumentError(
                f"{dim} = {extent} is above 2**30-1, the largest size kgen takes (the kernel's "
                "index math is 32-bit)"
            )
    for rule in getattr(plan, "block_dims", ()):
        counted = _extent(rule.of, resolved)
        if counted is not None and _extent(rule.dim, resolved) != -(-counted // rule.block):
            raise ArgumentError(
                f"{rule.dim} = {_extent(rule.dim, resolved)} but {rule.of} = {counted}: "
                f"{rule.reason}, so {rule.dim} must be ceil({rule.of} / {rule.block}) = "
                f"{-(-counted // rule.block)}"
            )
    leading = {name: _leading_dim(params[name], array) for name, array in arrays.items()}
    batch_strides = {name: _batch_stride(params[name], array, plan.batches(resolved))
                     for name, array in arrays.items() if params[name].batch is not None}
    _check_element_alignment(arrays)
    narrow = _fast_path_refusal(plan, arrays, leading, resolved, batch_strides)
    if narrow and plan.narrow_kernel is None:
        raise ArgumentError(narrow)

    values: dict[str, int | float] = {}
    for member in plan.fields:
        if member.kind is FieldKind.POINTER:
            values[member.name] = arrays[member.param].ptr
        elif member.kind is FieldKind.LEADING_DIM:
            values[member.name] = leading[member.param]
        elif member.kind is FieldKind.BATCH_STRIDE:
            values[member.name] = batch_strides[member.param]
        elif member.kind is FieldKind.SIZE:
            values[member.name] = resolved[member.dim]
        elif member.kind is FieldKind.SCALAR:
            values[member.name] = scalars[member.param]
        elif member.kind is FieldKind.WORKSPACE:
            values[member.name] = 0  # the launch provides it (CompiledKernel._workspace_pointer)
        else:  # pragma: no cover - a FieldKind added without runtime support
            raise KgenRuntimeError(f"the runtime cannot fill a {member.kind} member")
    grid = plan.grid(resolved, persistent_ctas)
    if plan.schedule.scheduler.cluster.size > 1 and not narrow:
        grid = plan.cluster_grid(resolved, persistent_clusters)
    tiles = plan.grid(resolved)[0]  # every tile of every batch: the kernel's int tile index
    if tiles > MAX_GRID:
        shown = ", ".join(f"{dim}={extent}" for dim, extent in resolved.items())
        raise ArgumentError(f"sizes {shown} make {tiles} CTAs; a launch takes at most 2**31-1")
    return BoundArguments(
        values=values, sizes=resolved, arrays=arrays, scalars=scalars, grid=grid,
        narrow=narrow, owners=tuple(a.owner for a in arrays.values()),
    )


def _extent(dim, sizes: Mapping[str, int]) -> int | None:
    """A dimension's value: a fixed one, or the size the arguments gave (None: none did)."""
    return dim if isinstance(dim, int) else sizes.get(dim)


def _infer_sizes(params: tuple[Param, ...], arrays: Mapping[str, DeviceArray],
                 given: Mapping[str, int]) -> dict[str, int]:
    """Symbolic dimensions from the arguments' shapes; they must agree everywhere."""
    sizes: dict[str, int] = {}
    source: dict[str, str] = {}  # dim -> "A is [1000, 64]" (who set it first)
    for dim, extent in given.items():
        if not isinstance(extent, int) or isinstance(extent, bool) or extent < 0:
            raise ArgumentError(f"sizes[{dim!r}] must be a non-negative int, got {extent!r}")
        sizes[dim] = extent
        source[dim] = f"sizes gives {dim}={extent}"
    for param in params:
        array = arrays.get(param.name)
        if array is None:
            continue
        declared = param.full_shape
        if param.kind is ParamKind.SCALAR and param.batch is None:  # a scalar output: one element
            if array.ndim > 1 or (array.ndim == 1 and array.shape[0] != 1):
                raise ArgumentError(
                    f"{param.name} is a scalar output: pass a tensor of one element, got "
                    f"{_shape_text(array.shape)}"
                )
            continue
        if array.ndim != len(declared):
            raise ArgumentError(
                f"{param.name} must be {len(declared)}-D {_shape_text(declared)} but is "
                f"{array.ndim}-D {_shape_text(array.shape)}"
            )
        here = f"{param.name} is {_shape_text(array.shape)}"
        for axis, (want, extent) in enumerate(zip(declared, array.shape)):
            if isinstance(want, int):
                if extent != want:
                    raise ArgumentError(
                        f"{here}, but its dimension {axis} must be {want} "
                        f"(declared {_shape_text(declared)})"
                    )
            elif want in sizes:
                if sizes[want] != extent:
                    raise ArgumentError(
                        f"{source[want]} and {here}: {want} differs ({sizes[want]} vs {extent})"
                    )
            else:
                sizes[want] = extent
                source[want] = here
    return sizes


def _leading_dim(param: Param, array: DeviceArray) -> int:
    """The leading dimension of a tensor stored in its declared layout, possibly padded (of
    each batch's matrix, for a batched tensor: the rules of its two inner dimensions)."""
    name = param.name
    if any(s < 0 for s in array.strides):
        raise ArgumentError(f"{name} has negative strides {array.strides}; pass a copy")
    if param.kind is ParamKind.SCALAR:  # an output, one element (per batch)
        return 0
    inner = len(param.shape)  # the matrix's or vector's dimensions, past the batch
    shape, strides = array.shape[-inner:], array.strides[-inner:]
    if 0 in array.shape:  # no elements (L, M, N or K = 0): any strides, as an empty array may
        # report zeros; the leading dimension a contiguous one would have
        if param.kind is not ParamKind.TENSOR:
            return 0
        return shape[1] if param.layout is Layout.ROW else shape[0]
    if param.kind is ParamKind.VECTOR:
        (length,) = shape
        if length > 1 and strides[0] != 1:
            raise ArgumentError(
                f"{name} must be contiguous but has stride {strides[0]}; pass a copy"
            )
        return 0
    if param.kind is not ParamKind.TENSOR:
        return 0
    rows, cols = shape
    row_stride, col_stride = strides
    if param.layout is Layout.ROW:
        unit_ok = col_stride == 1 or cols <= 1
        ld = row_stride if rows > 1 else max(row_stride, cols)
        extent, order, fix = cols, "row-major", ".contiguous()"
    else:
        unit_ok = row_stride == 1 or rows <= 1
        ld = col_stride if cols > 1 else max(col_stride, rows)
        extent, order = rows, "column-major"
        fix = (".t().contiguous().t()" if param.batch is None
               else ".transpose(-1, -2).contiguous().transpose(-1, -2)")
    if not unit_ok or ld < extent:
        raise ArgumentError(
            f"{name} must be {order} (declared {param.layout.value}), with a unit stride and a "
            f"leading dimension of at least {extent}; it has shape {_shape_text(array.shape)} and "
            f"strides {tuple(array.strides)}. Pass {name}{fix}"
        )
    return ld


def _batch_stride(param: Param, array: DeviceArray, batches: int) -> int:
    """Elements between consecutive batches of a batched argument: any (0 broadcasts an input
    to every batch; _leading_dim has refused negative ones), but an output's batches must not
    share their elements."""
    stride = array.strides[0]
    if param.is_output and batches > 1 and stride == 0:
        raise ArgumentError(
            f"{param.name} is an output with batch stride 0: its {batches} batches would write the "
            "same elements; pass a tensor with one matrix per batch"
        )
    return stride


def _check_element_alignment(arrays: Mapping[str, DeviceArray]) -> None:
    for name, array in arrays.items():
        size = array.dtype.nbytes if array.dtype else 1
        if array.ptr % size:
            raise ArgumentError(f"{name}'s address {array.ptr:#x} is not {size}-byte aligned")


def _fast_path_refusal(plan: KernelPlan, arrays: Mapping[str, DeviceArray],
                       leading: Mapping[str, int], sizes: Mapping[str, int],
                       batch_strides: Mapping[str, int] | None = None) -> str:
    """The first alignment or size rule of the fast entry point these arguments miss (the
    order of the .cu's checks), or ""."""
    for need in plan.alignments:
        array = arrays.get(need.param)
        if array is None:
            continue
        if need.ptr_bytes > 1 and array.ptr % need.ptr_bytes:
            return (f"{need.param}'s address {array.ptr:#x} is not {need.ptr_bytes}-byte "
                    f"aligned: {need.reason}")
        ld = leading.get(need.param, 0)
        if need.ld_multiple > 1 and ld and ld % need.ld_multiple:
            return (f"{need.param}'s leading dimension {ld} is not a multiple of "
                    f"{need.ld_multiple}: {need.reason}")
        stride = (batch_strides or {}).get(need.param, 0)
        if need.batch_multiple > 1 and stride % need.batch_multiple:
            return (f"{need.param}'s batch stride {stride} is not a multiple of "
                    f"{need.batch_multiple}: {need.reason}")
    for rule in getattr(plan, "dim_rules", ()):
        extent = rule.dim if isinstance(rule.dim, int) else sizes.get(rule.dim)
        if extent is not None and extent % rule.multiple:
            return f"{rule.dim} = {extent} is not a multiple of {rule.multiple}: {rule.reason}"
    return ""


def resolve_stream(stream: Any, arrays: Mapping[str, DeviceArray] | None = None) -> int:
    """A raw CUstream handle from None, an int, a torch/cupy/cuda.core stream or CUstream.
    None means PyTorch's current stream when a torch tensor is among the arguments, else the
    legacy default stream (0)."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and arrays:
            for array in arrays.values():
                if array.kind == "torch":
                    return int(torch.cuda.current_stream(array.device_id).cuda_stream)
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "__cuda_stream__"):  # cuda.core Stream and the protocol
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "ptr"):  # cupy
        return int(stream.ptr)
    try:
        return int(stream)  # cuda.bindings CUstream
    except (TypeError, ValueError):
        raise ArgumentError(f"cannot use {type(stream).__name__} as a CUDA stream") from None


class CompiledKernel:
    """A plan and its loaded cubin: call it with the kernel's arguments as keywords.

        k = kgen.load("gemm.kg")
        k(A=a, B=b, C=c, D=d, bias=v, alpha=1.5)       # scalars default as declared
    """

    def __init__(self, plan: KernelPlan, cubin: bytes, *, source: str | None = None,
                 compiled=None, device_id: int | None = None, narrow_compiled: bool = True,
                 extra_options: Mapping[str, Any] | None = None):
        from .device import (activate, can_run, check, current_device_id, device_info,
                             driver_refusal, driver_version)

        self.plan = plan
        self.cubin = cubin
        self.source = source
        self.compiled = compiled  # the nvrtc.CompileResult, when known
        self.device_id = current_device_id() if device_id is None else device_id
        activate(self.device_id)
        info = device_info(self.device_id)
        from .nvrtc import nvrtc_version

        nvrtc = tuple(int(x) for x in nvrtc_version().split(".")[:2])
        why = (driver_refusal(driver_version(), nvrtc)
               or can_run(plan.arch.value, info.compute_capability))
        if why:
            raise KgenRuntimeError(f"{plan.name} cannot run on {info.name}: {why}")
        if plan.smem_bytes > info.smem_optin_bytes:
            raise KgenRuntimeError(
                f"{plan.name} needs {plan.smem_bytes} bytes of shared memory; {info.name} allows "
                f"{info.smem_optin_bytes} per block"
            )
        self._struct = params_struct(plan)
        from cuda.bindings import driver
        from cuda.core import ObjectCode

        self._object = ObjectCode.from_cubin(cubin, name=plan.name)
        try:
            self._kernel = self._object.get_kernel(plan.name)
        except Exception as err:
            raise KgenRuntimeError(f"cannot load {plan.name} from its cubin: {err}") from None
        # cuda.core hands out a context-free CUkernel; the launch and the attribute want the
        # CUfunction of the current (primary) context.
        self._function = check(
            driver.cuKernelGetFunction(self._kernel.handle), "cuKernelGetFunction"
        )
        # The narrow entry point: the arguments that miss the fast one's alignment rules. A
        # module of the fast entry point alone (narrow_compiled False: nvrtc.FAST_ENTRY_ONLY)
        # compiles it from `source`, with `extra_options`, on the first launch that needs it.
        self._extra_options = dict(extra_options or {})
        self._narrow_function = (function_of(self._object, plan.narrow_kernel)
                                 if narrow_compiled else None)
        self._narrow_object = None
        # Reductions: a small kernel sets their outputs to the identity before each launch
        # (atomic mode), or combines the CTAs' partials after it (deterministic mode).
        self._init_function = function_of(self._object, plan.init_kernel)
        self._finalize_function = function_of(self._object, plan.finalize_kernel)
        # Split-K: a kernel sums the CTAs' partials from the workspace and runs the epilogue
        self._split_function = function_of(self._object, plan.split_kernel)
        # Launches may come from several threads: the narrow entry point loads under this lock.
        self._lock = threading.Lock()
        for function in (self._function, self._narrow_function):
            allow_smem(function, plan.smem_bytes)
        self._check_abi()
        self._calls = CallPath(plan, lambda args, sizes: self)
        # A persistent plan runs one CTA per resident slot: SM count x CTAs per SM (occupancy).
        self.persistent_ctas = None
        if plan.schedule.scheduler.persistent:
            per_sm = check(
                driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    self._function, plan.schedule.warps.threads, plan.smem_bytes),
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            )
            self.persistent_ctas = info.sm_count * max(int(per_sm), 1)
        # On clusters (the fast entry point only): as many clusters as fit at once.
        self.persistent_clusters = None
        if plan.schedule.scheduler.cluster.size > 1:
            self.persistent_clusters = int(check(
                driver.cuOccupancyMaxActiveClusters(self._function, self._cluster_config(
                    plan.schedule.scheduler.cluster.size, 0)),
                "cuOccupancyMaxActiveClusters"))
            if self.persistent_clusters < 1:
                raise KgenRuntimeError(
                    f"{plan.name}: no cluster of {plan.schedule.scheduler.cluster.size} CTAs with "
                    f"{plan.smem_bytes} B of shared memory each fits on {info.name}")

    def _cluster_config(self, ctas: int, stream: int):
        """A launch of `ctas` CTAs of the fast entry point, in clusters of the plan's size."""
        from cuda.bindings import driver

        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x = self.plan.schedule.scheduler.cluster.size  # consecutive CTAs
        attribute.value.clusterDim.y = 1
        attribute.value.clusterDim.z = 1
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = ctas, 1, 1
        threads = self.plan.schedule.warps.threads
        config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
        config.sharedMemBytes = self.plan.smem_bytes
        config.hStream = driver.CUstream(stream)
        config.attrs = [attribute]
        config.numAttrs = 1
        return config

    def _narrow_entry(self):
        """The narrow entry point's function; where the module holds the fast entry point
        alone, compiled (the whole source) and loaded by the first launch that needs it."""
        if self._narrow_function is None:
            with self._lock:
                if self._narrow_function is None:
                    self._narrow_object, self._narrow_function = compile_narrow(
                        self.plan, self.source, self.device_id, self._extra_options)
        return self._narrow_function

    def _check_abi(self) -> None:
        """The kernel's first parameter must be exactly the params struct, and a TMA-store
        plan's second one a tensor map. Only those indices are asked for: probing past the last
        parameter is an API error that compute-sanitizer reports (cuda.core's `arguments_info`
        does that)."""
        from cuda.bindings import driver

        from .tma import MAP_BYTES

        expected = [("first", ctypes.sizeof(self._struct), "the runtime's params struct",
                     "the emitter and plan.fields disagree")]
        maps = len(self.plan.schedule.tensor_maps)
        if maps:
            expected.append(("second", maps * MAP_BYTES, f"{maps} tensor map(s)",
                             "the emitter and plan.schedule.tensor_maps disagree"))
        for index, (which, nbytes, what, why) in enumerate(expected):
            try:
                err, _offset, size = driver.cuKernelGetParamInfo(self._kernel.handle, index)
            except Exception:  # older drivers or bindings cannot report parameter info
                return
            if err != driver.CUresult.CUDA_SUCCESS:
                return
            if int(size) != nbytes:
                raise KgenRuntimeError(
                    f"{self.plan.name}: the cubin's {which} parameter is {size} bytes but "
                    f"{what} is {nbytes}: {why}"
                )

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def registers(self) -> int | None:
        return self.compiled.registers if self.compiled is not None else None

    def bind(self, sizes: Mapping[str, int] | None = None, **args) -> BoundArguments:
        return bind_arguments(self.plan, args, sizes=sizes, device_id=self.device_id,
                              persistent_ctas=self.persistent_ctas,
                              persistent_clusters=self.persistent_clusters)

    def __call__(self, stream: Any = None, sizes: Mapping[str, int] | None = None, **args):
        """Check the arguments and launch (asynchronously). Outputs not given are allocated,
        like the inputs (torch tensors on their device when an input is a torch tensor, else
        DeviceBuffers); returns the outputs in declaration order, one alone as itself. The
        checks run once per argument signature (kgen.runtime.calls)."""
        return self._calls(stream, sizes, args)

    def _allocate(self, names: list[str], args: Mapping[str, Any],
                  sizes: Mapping[str, int] | None) -> dict[str, Any]:
        from .buffers import DeviceBuffer

        given = {name: tuple(value.shape) for name, value in args.items()
                 if value is not None and hasattr(value, "shape")}
        found = {**infer_sizes(self.plan, given), **dict(sizes or {})}
        layout = output_shapes(self.plan, found, names)
        torch = sys.modules.get("torch")
        like = next((v for v in args.values()
                     if torch is not None and isinstance(v, torch.Tensor)), None)
        out = {}
        for name, (shape, strides) in layout.items():
            dtype = self.plan.param(name).dtype
            if like is not None:
                torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
                out[name] = torch.empty_strided(shape, strides, dtype=torch_dtype,
                                                device=like.device)
            else:
                out[name] = DeviceBuffer(shape, dtype, strides=strides, device_id=self.device_id)
        return out

    def launch(self, bound: BoundArguments, stream: int = 0) -> None:
        """Launch already-checked arguments on a raw stream handle (asynchronous)."""
        self._calls.launch_bound(self, bound, stream)

    def __repr__(self) -> str:
        plan = self.plan
        return (f"CompiledKernel({plan.name}, {plan.arch.value}, cuda:{self.device_id}, "
                f"{plan.schedule.warps.threads} threads, {plan.smem_bytes} B smem)")
