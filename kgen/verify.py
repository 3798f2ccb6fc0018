"""Semantic checks on kgen IR, from the DSL or built in Python: the first problem, located.

`verify(module)` walks each kernel in source order and raises `KgenError(node.loc, message)` at
the first problem: unsafe or duplicate names, unknown targets, dtypes the MMA cannot take,
shapes that do not agree, stores to the wrong kind of parameter, outputs written zero or two
times, misplaced reductions. It assumes nothing that the parser checks, because Python code may
build the IR directly. Tile, warp and shared-memory feasibility belong to kgen/lower.

This module also owns identifier safety (`check_identifier`, `RESERVED_IDENTIFIERS`): DSL names
become C++ identifiers in the emitted source, so the parser and this verifier refuse the same
names with the same messages.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field

from . import ir
from .errors import NOWHERE, KgenError, SourceLoc
from .ir import Arch, Axis, DType, ParamKind, ReduceOp, Role
from .targets import TARGETS

from .diagnostics import (
    ARCH_NAMES as _ARCH_NAMES,
    DTYPE_NAMES as _DTYPE_NAMES,
    RESERVED_IDENTIFIERS,
    arity_message,
    at_line,
    check_identifier,
    did_you_mean,
    dim_problem,
    f32_problem,
    number_text,
    or_list,
    quote,
    setting_problem,
    shape_text,
    shown,
)
from .language import (
    F32_MAX,
    MAX_DIM,
    MAX_EXPR_DEPTH,
    MAX_EXPR_NODES,
    MAX_SETTING,
    REDUCTIONS,
    reduction_name,
)


def _operands(node: object) -> tuple:
    if isinstance(node, ir.Call):
        return node.args if isinstance(node.args, tuple) else ()
    if isinstance(node, (ir.Cast, ir.Reduce)):
        return (node.arg,)
    return ()


def expression_extent(expr: object, locals_: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(depth, size) of `expr` once each local is replaced by its value (`locals_` holds the
    extents of the locals bound so far): the tree that the lowering walks. Iterative, and
    linear in the number of nodes however often the locals are shared."""
    done: dict[int, tuple[int, int]] = {}
    stack: list[tuple[object, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if isinstance(node, ir.LocalRef):
            name = node.name if isinstance(node.name, str) else ""
            done[id(node)] = locals_.get(name, (1, 1))
            continue
        children = _operands(node)
        if children and not expanded:
            stack.append((node, True))
            stack.extend((child, False) for child in children)
            continue
        depth = 1 + max((done[id(c)][0] for c in children), default=0)
        size = min(1 + sum(done[id(c)][1] for c in children), MAX_EXPR_NODES + 1)
        done[id(node)] = (depth, size)
    return done[id(expr)]



# ---------------------------------------------------------------------------------------------
# Reductions are checked in full below but not generated yet. This switch is the one place that
# refuses them; set it to True once kgen/lower and kgen/emit handle ir.Reduce.
REDUCTIONS_SUPPORTED = True


# ---------------------------------------------------------------------------------------------
# The verifier


def verify(module: ir.Module) -> None:
    """Check every kernel of a module; raise KgenError at the first problem."""
    if not isinstance(module, ir.Module):
        raise KgenError(NOWHERE, f"verify() takes a kgen.ir.Module, got {type(module).__name__}")
    if not module.kernels:
        raise KgenError(NOWHERE, f"{module.file} holds no kernel")
    seen: dict[str, SourceLoc] = {}
    for kernel in module.kernels:
        if not isinstance(kernel, ir.Kernel):
            raise KgenError(NOWHERE, f"a module holds kernels, got {type(kernel).__name__}")
        check_identifier(kernel.name, kernel.loc, "kernel")
        if kernel.name in seen:
            raise KgenError(
                kernel.loc,
                f"duplicate kernel name {quote(kernel.name)} "
                f"(first defined{at_line(seen[kernel.name])})",
            )
        verify_kernel(kernel)
        seen[kernel.name] = kernel.loc


def verify_kernel(kernel: ir.Kernel) -> None:
    """Check one kernel; raise KgenError at the first problem."""
    if not isinstance(kernel, ir.Kernel):
        raise KgenError(NOWHERE, f"verify_kernel() takes a kgen.ir.Kernel, got {shown(kernel)}")
    try:
        _KernelChecker(kernel).run()
    except RecursionError:
        raise KgenError(kernel.loc, "expression nested too deeply") from None


@dataclass
class _EpilogueScope:
    gemm: ir.Gemm
    shape: tuple  # (M, N) the epilogue works on
    bound: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound so far
    later: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound further down
    self_store: SourceLoc | None = None  # `g0 = ...` in a chained stage's epilogue


def _loc_of(node: object, fallback: SourceLoc = NOWHERE) -> SourceLoc:
    loc = getattr(node, "loc", None)
    return loc if isinstance(loc, SourceLoc) else fallback


def _require_str(value: object, loc: SourceLoc, what: str) -> str:
    if not isinstance(value, str):
        raise KgenError(loc, f"{what} must be a string, got {shown(value)}")
    return value


def _a_name(gemm: object) -> object:
    """The A operand's name of something that should be a Gemm, or None."""
    return getattr(getattr(gemm, "a", None), "name", None)


def _best(*locs: SourceLoc) -> SourceLoc:
    """The first location that points into a file."""
    return next((loc for loc in locs if loc.line > 0), locs[-1])


class _KernelChecker:
    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.target = None
        self.names: dict[str, tuple[str, SourceLoc]] = {}  # every defined name: (kind, loc)
        self.params: dict[str, ir.Param] = {}
        self.gemm_shapes: dict[str, tuple] = {}  # checked gemms -> (M, N) of their output
        self.consumer: dict[str, ir.Gemm] = {}  # gemm name -> the later gemm it feeds
        self.local_owner: dict[str, str] = {}  # local name -> its gemm
        self.written: dict[str, SourceLoc] = {}  # output param -> its store

    # -- names ---------------------------------------------------------------------------------

    def define(self, name: str, kind: str, loc: SourceLoc) -> None:
        check_identifier(name, loc, kind)
        if name in self.names:
            first_kind, first_loc = self.names[name]
            raise KgenError(
                loc,
                f"duplicate name '{name}' (first defined{at_line(first_loc)} as a {first_kind})",
            )
        self.names[name] = (kind, loc)

    # -- kernel --------------------------------------------------------------------------------

    def run(self) -> None:
        k = self.kernel
        check_identifier(k.name, k.loc, "kernel")
        if not isinstance(k.target, Arch) or k.target not in TARGETS:
            raise KgenError(
                _best(k.target_loc, k.loc),
                f"unknown target {quote(getattr(k.target, 'value', k.target))}; "
                f"expected {_ARCH_NAMES}",
            )
        self.target = TARGETS[k.target]
        if k.compute_dtype not in (DType.F32, DType.F16, DType.BF16):
            name = getattr(k.compute_dtype, "dsl_name", None) or shown(k.compute_dtype)
            raise KgenError(k.loc, f"compute type {name} is not one of f32, f16, bf16")
        for attr in ("params", "gemms"):
            if not isinstance(getattr(k, attr), tuple):
                got = shown(getattr(k, attr))
                raise KgenError(k.loc, f"kernel {attr} must be a tuple, got {got}")
        for param in k.params:
            self.check_param(param)
        for gemm in k.gemms:
            if not isinstance(gemm, ir.Gemm):
                raise KgenError(k.loc, f"kernel gemms must be kgen.ir.Gemm, got {shown(gemm)}")
        for gemm in k.gemms:
            self.check_gemm(gemm)
        self.check_storage(k)
        # A kernel with only a storage declaration can be planned and inspected, not emitted.
        storage_only = not k.gemms and k.storage is not None
        if not k.gemms and not storage_only:
            raise KgenError(k.loc, f"kernel '{k.name}' has no gemm")
        outputs = [p for p in k.params if p.role is Role.OUT]
        for param in outputs:
            if param.name not in self.written:
                raise KgenError(param.loc, f"output '{param.name}' is never written")
        if not outputs and not storage_only:
            raise KgenError(
                k.loc, f"kernel '{k.name}' has no output; mark a tensor 'out' and store to it"
            )

    # -- phases and storage (their names, phases and layout are checked by kgen/lower) ---------

    def check_storage(self, k: ir.Kernel) -> None:
        if not isinstance(k.phases, tuple) or not all(
            isinstance(p, ir.Phase) and isinstance(p.name, str) for p in k.phases
        ):
            raise KgenError(k.loc, f"kernel phases must be a tuple of kgen.ir.Phase, got "
                                   f"{shown(k.phases)}")
        if k.storage is None:
            return
        if not isinstance(k.storage, ir.StorageDecl):
            raise KgenError(k.loc, f"kernel storage must be a kgen.ir.StorageDecl, got "
                                   f"{shown(k.storage)}")
        decl = k.storage
        if not isinstance(decl.persistent, tuple) or not isinstance(decl.packed, tuple):
            raise KgenError(_best(decl.loc, k.loc), "storage persistent and packed members must "
                                                    "be tuples")
        for m in decl.packed:
            if not isinstance(m, ir.SmemBuffer):
                raise KgenError(_best(_loc_of(m), decl.loc, k.loc),
                                f"packed storage members must be kgen.ir.SmemBuffer, got "
                                f"{shown(m)}")
        if decl.root is not None and not isinstance(decl.root, (ir.Union, ir.Struct)):
            raise KgenError(_best(decl.loc, k.loc), f"storage root must be a kgen.ir.Union or "
                                                    f"Struct, got {shown(decl.root)}")
        stack = list(decl.persistent) + ([decl.root] if decl.root is not None else [])
        stack += list(decl.packed)
        while stack:
            m = stack.pop()
            loc = _best(_loc_of(m), decl.loc, k.loc)
            if isinstance(m, (ir.Union, ir.Struct)):
                if not isinstance(m.members, tuple):
                    raise KgenError(loc, "union and struct members must be a tuple")
                stack.extend(m.members)
            elif isinstance(m, ir.SmemBuffer):
                _require_str(m.name, loc, "a buffer name")
                if not isinstance(m.dtype, DType):
                    raise KgenError(loc, f"unknown dtype {quote(m.dtype)}; expected {_DTYPE_NAMES}")
                if not isinstance(m.shape, tuple) or not isinstance(m.live, tuple) or not all(
                    isinstance(r, ir.LiveRange) and isinstance(r.first, str)
                    and isinstance(r.last, str) for r in m.live
                ):
                    raise KgenError(loc, f"buffer {quote(m.name)}: shape must be a tuple of ints "
                                         "and live a tuple of kgen.ir.LiveRange")
            elif isinstance(m, ir.BufferRef):
                _require_str(m.name, loc, "a buffer name")
            elif isinstance(m, ir.StageBuffers):
                if not isinstance(m.kind, ir.StageKind):
                    raise KgenError(loc, f"stage kind must be a kgen.ir.StageKind, got "
                                         f"{shown(m.kind)}")
                _require_str(m.gemm, loc, "a gemm name")
            else:
                raise KgenError(loc, f"not a storage member: {shown(m)}")

    # -- parameters ----------------------------------------------------------------------------

    def check_param(self, p: ir.Param) -> None:
        loc = _loc_of(p, self.kernel.loc)
        if not isinstance(p, ir.Param):
            raise KgenError(loc, f"kernel params must be kgen.ir.Param, got {shown(p)}")
        if not isinstance(p.kind, ParamKind):
            raise KgenError(loc, f"param kind must be a kgen.ir.ParamKind, got {shown(p.kind)}")
        kind = p.kind.value
        self.define(p.name, kind, loc)
        if not isinstance(p.dtype, DType):
            raise KgenError(loc, f"unknown dtype {quote(p.dtype)}; expected {_DTYPE_NAMES}")
        if not isinstance(p.layout, ir.Layout):
            raise KgenError(loc, f"layout must be a kgen.ir.Layout, got {shown(p.layout)}")
        if not isinstance(p.role, Role):
            raise KgenError(loc, f"role must be a kgen.ir.Role, got {shown(p.role)}")
        if not isinstance(p.shape, tuple):
            raise KgenError(
                loc, f"shape of {kind} '{p.name}' must be a tuple, got {shown(p.shape)}"
            )

        rank = {ParamKind.TENSOR: 2, ParamKind.VECTOR: 1, ParamKind.SCALAR: 0}[p.kind]
        if len(p.shape) != rank:
            what = {2: "2 dimensions [rows, cols]", 1: "1 dimension [length]", 0: "no shape"}
            raise KgenError(
                loc,
                f"{kind} '{p.name}' must have {what[rank]}, got {shape_text(p.shape)}",
            )
        for dim in p.shape:
            if isinstance(dim, str):
                # A dimension is defined where it is first used; later uses share it.
                if self.names.get(dim, ("",))[0] != "dimension":
                    self.define(dim, "dimension", loc)
            elif problem := dim_problem(dim):
                raise KgenError(loc, problem)

        allowed = {DType.F32} if p.kind is ParamKind.SCALAR else {DType.F16, DType.BF16, DType.F32}
        if p.dtype not in allowed:
            names = or_list([d.dsl_name for d in DType if d in allowed])
            raise KgenError(loc, f"{kind} '{p.name}' must be {names}, got {p.dtype.dsl_name}")
        if p.kind is not ParamKind.TENSOR and p.layout is not ir.Layout.ROW:
            raise KgenError(loc, f"only tensors have a layout; '{p.name}' is a {kind}")
        if p.default is not None:
            if p.kind is not ParamKind.SCALAR or p.role is Role.OUT:
                what = "an output scalar" if p.kind is ParamKind.SCALAR else f"a {kind}"
                raise KgenError(
                    loc, f"only input scalars can have a default; '{p.name}' is {what}"
                )
            if problem := f32_problem(p.default, f"default of scalar '{p.name}'"):
                raise KgenError(loc, problem)
        if p.role is Role.OUT and p.dtype not in self.target.output_dtypes:
            raise KgenError(
                loc,
                f"output dtype {p.dtype.dsl_name} is not supported on {self.target.arch.value}",
            )
        self.params[p.name] = p

    # -- gemm stages ---------------------------------------------------------------------------

    def check_gemm(self, g: ir.Gemm) -> None:
        loc = g.loc
        self.define(g.name, "gemm", loc)
        for attr, cls in (
            ("a", ir.OperandRef),
            ("b", ir.OperandRef),
            ("tile", ir.TileShape),
            ("warps", ir.WarpGrid),
            ("stages", ir.StageCount),
            ("epilogue", ir.Epilogue),
        ):
            if not isinstance(getattr(g, attr), cls):
                raise KgenError(
                    loc, f"gemm '{g.name}': {attr} must be a kgen.ir.{cls.__name__}"
                )
        self.check_settings(g)

        a_loc = _best(g.a.loc, loc)
        b_loc = _best(g.b.loc, loc)
        for ref in (g.a, g.b):
            _require_str(ref.name, _best(ref.loc, loc), "an operand name")
        a_shape = self.gemm_shapes.get(g.a.name)
        if a_shape is not None:
            if g.a.name in self.consumer:
                first = self.consumer[g.a.name]
                raise KgenError(
                    a_loc,
                    f"gemm '{g.a.name}' already feeds gemm '{first.name}'{at_line(first.loc)}; "
                    "a gemm can feed only one later gemm",
                )
            self.consumer[g.a.name] = g
        else:
            a_param = self.operand_param(g, g.a, "A", a_loc)
            a_shape = a_param.shape
        b_param = self.operand_param(g, g.b, "B", b_loc)

        # A chained stage hands its output to this gemm in this gemm's operand dtype.
        chained = g.a.name in self.gemm_shapes
        a_dtype = b_param.dtype if chained else a_param.dtype
        if a_dtype is not b_param.dtype:
            raise KgenError(
                b_loc,
                f"operand dtypes differ: A is {a_dtype.dsl_name} but B is "
                f"{b_param.dtype.dsl_name}",
            )
        arch = self.target.arch.value
        if a_dtype not in self.target.operand_dtypes:
            usable = or_list([d.dsl_name for d in DType if d in self.target.operand_dtypes])
            raise KgenError(
                b_loc if chained else a_loc,  # a chained A takes B's dtype
                f"dtype {a_dtype.dsl_name} is not supported as an MMA operand on {arch} "
                f"(use {usable})",
            )
        if not isinstance(g.acc_dtype, DType) or g.acc_dtype not in self.target.acc_dtypes:
            usable = or_list([d.dsl_name for d in DType if d in self.target.acc_dtypes])
            name = getattr(g.acc_dtype, "dsl_name", None) or shown(g.acc_dtype)
            raise KgenError(
                loc, f"accumulate type {name} is not supported on {arch} (use {usable})"
            )
        if a_shape[1] != b_param.shape[0]:
            raise KgenError(
                b_loc,
                f"inner dimensions differ: A is {shape_text(a_shape)} but B is "
                f"{shape_text(b_param.shape)}",
            )
        if not isinstance(g.resident, bool):
            raise KgenError(loc, f"resident must be True or False, got {shown(g.resident)}")
        if g.keep is not None:
            if not isinstance(g.keep, ir.Residency):
                raise KgenError(loc, f"keep must be a kgen.ir.Residency, got {shown(g.keep)}")
            if not chained:
                raise KgenError(
                    loc, "keep applies only to a gemm whose A operand is an earlier gemm"
                )

        shape = (a_shape[0], b_param.shape[1])
        self.check_epilogue(g, shape)
        self.gemm_shapes[g.name] = shape

    def check_settings(self, g: ir.Gemm) -> None:
        checks = (
            (g.tile, (("m", "tile M"), ("n", "tile N"), ("k", "tile K"))),
            (g.warps, (("m", "warps M"), ("n", "warps N"))),
            (g.stages, (("count", "stages"),)),
        )
        for node, fields in checks:
            for attr, what in fields:
                if problem := setting_problem(getattr(node, attr), what):
                    raise KgenError(_best(node.loc, g.loc), problem)

    def operand_param(self, g: ir.Gemm, ref: ir.OperandRef, which: str, loc) -> ir.Param:
        name = ref.name
        param = self.params.get(name)
        if param is None:
            later = next((h for h in self.kernel.gemms if h.name == name), None)
            if later is not None and which == "B":
                raise KgenError(
                    loc,
                    f"B operand '{name}' is a gemm; only the A operand can be an earlier gemm",
                )
            if later is not None:
                raise KgenError(
                    loc,
                    f"A operand '{name}' is not an earlier gemm; a gemm can only use "
                    "the output of a gemm defined before it",
                )
            candidates = [*self.params, *self.gemm_shapes]
            raise KgenError(
                loc, f"unknown operand {quote(name)}{did_you_mean(str(name), candidates)}"
            )
        if param.kind is not ParamKind.TENSOR:
            raise KgenError(
                loc, f"{which} operand '{name}' must be a tensor, not a {param.kind.value}"
            )
        if param.role is not Role.IN:
            raise KgenError(
                loc, f"{which} operand '{name}' is an output tensor; operands must be inputs"
            )
        return param

    # -- epilogues -----------------------------------------------------------------------------

    def check_epilogue(self, g: ir.Gemm, shape: tuple) -> None:
        scope = _EpilogueScope(g, shape)
        stmts = g.epilogue.stmts
        if not isinstance(stmts, tuple):
            raise KgenError(g.loc, f"epilogue of gemm '{g.name}' must hold a tuple of statements")
        for stmt in stmts:
            if isinstance(stmt, (ir.Let, ir.Store)):
                what = "a local name" if isinstance(stmt, ir.Let) else "a store target"
                _require_str(stmt.name if isinstance(stmt, ir.Let) else stmt.target, stmt.loc, what)
            if isinstance(stmt, ir.Let):
                scope.later.setdefault(stmt.name, stmt.loc)
        extents: dict[str, tuple[int, int]] = {}
        for stmt in stmts:
            if isinstance(stmt, (ir.Let, ir.Store)):
                self.check_extent(stmt, extents)
        for stmt in stmts:
            if isinstance(stmt, ir.Let):
                self.check_let(stmt, scope)
            elif isinstance(stmt, ir.Store):
                self.check_store(stmt, scope)
            else:
                raise KgenError(
                    g.loc, f"epilogue statements must be Let or Store, got {shown(stmt)}"
                )
        if g.name in self.consumer_names() and scope.self_store is None:
            feeds = self.consumer_of(g.name)
            raise KgenError(
                g.loc,
                f"gemm '{g.name}' feeds gemm '{feeds.name}' but its epilogue never sets "
                f"'{g.name}' (add e.g. '{g.name} = acc')",
            )

    def check_extent(self, stmt: ir.Let | ir.Store, extents: dict[str, tuple[int, int]]):
        """The lowering inlines locals: bound the depth (recursion) and the size (a local used
        twice by the next one, and so on, doubles the tree each time) of what it will walk."""
        depth, size = expression_extent(stmt.value, extents)
        if depth > MAX_EXPR_DEPTH:
            raise KgenError(
                stmt.loc,
                f"expression nested too deeply ({depth} levels once locals are substituted; "
                f"at most {MAX_EXPR_DEPTH})",
            )
        if size > MAX_EXPR_NODES:
            raise KgenError(
                stmt.loc,
                f"expression too large once locals are substituted (more than {MAX_EXPR_NODES} "
                "operations, counting a local each time it is used)",
            )
        if isinstance(stmt, ir.Let):
            extents[stmt.name] = (depth, size)

    def consumer_names(self) -> set[str]:
        return {name for h in self.kernel.gemms if isinstance(name := _a_name(h), str)}

    def consumer_of(self, name: str) -> ir.Gemm:
        return next(h for h in self.kernel.gemms if _a_name(h) == name)

    def check_let(self, stmt: ir.Let, scope: _EpilogueScope) -> None:
        if isinstance(stmt.value, ir.Reduce):
            raise KgenError(
                stmt.value.loc,
                "a reduction must be the whole right side of a store to a vector or scalar",
            )
        self.check_expr(stmt.value, scope, in_reduce=False)
        self.define(stmt.name, "local", stmt.loc)
        scope.bound[stmt.name] = stmt.loc
        self.local_owner[stmt.name] = scope.gemm.name

    def check_store(self, stmt: ir.Store, scope: _EpilogueScope) -> None:
        name, value, g = stmt.target, stmt.value, scope.gemm
        param = self.params.get(name)
        if param is None:
            self.check_gemm_store(stmt, scope)
            return
        kind = param.kind.value
        if param.role is not Role.OUT:
            raise KgenError(stmt.loc, f"cannot store to input {kind} '{name}'")
        if name in self.written:
            raise KgenError(
                stmt.loc,
                f"output '{name}' is written twice (first{at_line(self.written[name])})",
            )

        if param.kind is ParamKind.TENSOR:
            if isinstance(value, ir.Reduce):
                raise KgenError(
                    value.loc,
                    f"'{name}' is a tensor; a reduction can only be stored to a vector "
                    "or a scalar",
                )
            self.check_expr(value, scope, in_reduce=False)
            if param.shape != scope.shape:
                raise KgenError(
                    stmt.loc,
                    f"tensor '{name}' has shape {shape_text(param.shape)} but gemm '{g.name}' "
                    f"produces {shape_text(scope.shape)}",
                )
        else:
            if not isinstance(value, ir.Reduce):
                examples = "rowsum, colmax, ..." if param.kind is ParamKind.VECTOR else (
                    "reduce_sum, reduce_max, ..."
                )
                raise KgenError(
                    stmt.loc,
                    f"'{name}' is a {kind}; only a reduction ({examples}) can be stored to it",
                )
            self.check_reduce_store(param, value, scope)
        self.written[name] = stmt.loc

    def check_gemm_store(self, stmt: ir.Store, scope: _EpilogueScope) -> None:
        """`g0 = expr` in g0's own epilogue: the value g0 hands to the gemm it feeds."""
        name, g = stmt.target, scope.gemm
        if name == g.name:
            if name not in self.consumer_names():
                raise KgenError(
                    stmt.loc,
                    f"gemm '{name}' feeds no later gemm, so its epilogue cannot set '{name}'; "
                    "store to an output instead",
                )
            if scope.self_store is not None:
                raise KgenError(
                    stmt.loc,
                    f"'{name}' is set twice (first{at_line(scope.self_store)})",
                )
            if isinstance(stmt.value, ir.Reduce):
                raise KgenError(
                    stmt.value.loc,
                    "a reduction must be the whole right side of a store to a vector or scalar",
                )
            self.check_expr(stmt.value, scope, in_reduce=False)
            scope.self_store = stmt.loc
            return
        if any(h.name == name for h in self.kernel.gemms):
            raise KgenError(
                stmt.loc, f"cannot store to gemm '{name}' from the epilogue of gemm '{g.name}'"
            )
        if name in scope.bound or name in self.local_owner:
            raise KgenError(stmt.loc, f"cannot store to local '{name}'; it is not an output")
        raise KgenError(
            stmt.loc,
            f"cannot store to unknown name {quote(name)}{did_you_mean(str(name), self.params)}",
        )

    def check_reduce_store(self, param: ir.Param, red: ir.Reduce, scope: _EpilogueScope):
        name, kind = param.name, param.kind.value
        if not isinstance(red.op, ReduceOp) or not isinstance(red.axis, Axis):
            raise KgenError(red.loc, "a reduction needs a kgen.ir.ReduceOp and a kgen.ir.Axis")
        spelled = reduction_name(red.op, red.axis)
        M, N = scope.shape
        if red.axis is Axis.ALL:
            if param.kind is not ParamKind.SCALAR:
                raise KgenError(
                    red.loc,
                    f"{spelled} gives one value; '{name}' is a {kind} (store it to a scalar)",
                )
        else:
            if param.kind is not ParamKind.VECTOR:
                raise KgenError(
                    red.loc,
                    f"{spelled} gives a vector; '{name}' is a {kind} "
                    f"(use reduce_{red.op.value} for one value)",
                )
            per, need = ("row", M) if red.axis is Axis.ROW else ("column", N)
            if param.shape[0] != need:
                raise KgenError(
                    red.loc,
                    f"{spelled} gives one value per {per}, so vector '{name}' needs length "
                    f"{need}, but it has length {param.shape[0]}",
                )
        self.check_expr(red.arg, scope, in_reduce=True)
        if not REDUCTIONS_SUPPORTED:
            raise KgenError(red.loc, "reductions are not supported by this kgen version yet")

    def check_expr(self, e: ir.Expr, scope: _EpilogueScope, in_reduce: bool) -> None:
        loc = _loc_of(e, scope.gemm.loc)
        if isinstance(e, ir.Acc):
            return
        if isinstance(e, ir.Const):
            if problem := f32_problem(e.value, "constant"):
                raise KgenError(loc, problem)
            return
        if isinstance(e, ir.Call):
            if not isinstance(e.op, ir.Op):
                raise KgenError(loc, f"a call needs a kgen.ir.Op, got {shown(e.op)}")
            spelled = e.op.spelling if e.op.spelling.isidentifier() else f"'{e.op.spelling}'"
            if not isinstance(e.args, tuple) or len(e.args) != e.op.arity:
                got = len(e.args) if isinstance(e.args, (tuple, list)) else shown(e.args)
                raise KgenError(loc, arity_message(spelled, e.op.arity, got))
            for arg in e.args:
                self.check_expr(arg, scope, in_reduce)
            return
        if isinstance(e, ir.Cast):
            if not isinstance(e.dtype, DType):
                raise KgenError(loc, f"unknown dtype {quote(e.dtype)}; expected {_DTYPE_NAMES}")
            self.check_expr(e.arg, scope, in_reduce)
            return
        if isinstance(e, ir.Reduce):
            if in_reduce:
                raise KgenError(loc, "cannot reduce a reduction")
            raise KgenError(
                loc, "a reduction must be the whole right side of a store to a vector or scalar"
            )
        if isinstance(e, ir.LocalRef):
            self.check_local_ref(e, scope)
            return
        if isinstance(e, (ir.ScalarLoad, ir.TensorLoad, ir.VectorLoad)):
            self.check_load(e, scope)
            return
        raise KgenError(loc, f"not an epilogue expression: {shown(e)}")

    def check_local_ref(self, e: ir.LocalRef, scope: _EpilogueScope) -> None:
        name = _require_str(e.name, e.loc, "a local name")
        if name in scope.bound:
            return
        if name in scope.later:
            raise KgenError(
                e.loc, f"'{name}' is used before it is defined{at_line(scope.later[name])}"
            )
        if name in self.local_owner:
            raise KgenError(
                e.loc,
                f"'{name}' is a local of gemm '{self.local_owner[name]}'; a local is visible "
                "only in its own epilogue",
            )
        raise KgenError(
            e.loc, f"unknown local {quote(name)}{did_you_mean(str(name), scope.bound)}"
        )

    def check_load(self, e, scope: _EpilogueScope) -> None:
        want = {
            ir.ScalarLoad: ParamKind.SCALAR,
            ir.TensorLoad: ParamKind.TENSOR,
            ir.VectorLoad: ParamKind.VECTOR,
        }[type(e)]
        param = self.params.get(_require_str(e.name, e.loc, "a parameter name"))
        if param is None:
            raise KgenError(
                e.loc,
                f"unknown {want.value} {quote(e.name)}{did_you_mean(str(e.name), self.params)}",
            )
        kind = param.kind.value
        if param.kind is not want:
            raise KgenError(e.loc, f"'{e.name}' is a {kind}, not a {want.value}")
        if param.role is Role.OUT:
            raise KgenError(
                e.loc,
                f"cannot read output {kind} '{e.name}'; to reuse a value, bind it to a local "
                "(t = ...) and use that",
            )
        M, N = scope.shape
        if isinstance(e, ir.TensorLoad) and param.shape != scope.shape:
            raise KgenError(
                e.loc,
                f"tensor '{e.name}' has shape {shape_text(param.shape)} but gemm "
                f"'{scope.gemm.name}' produces {shape_text(scope.shape)}",
            )
        if isinstance(e, ir.VectorLoad):
            if e.axis not in (Axis.ROW, Axis.COL):
                raise KgenError(
                    e.loc, f"vector '{e.name}' must be indexed by row or col, got {shown(e.axis)}"
                )
            need = M if e.axis is Axis.ROW else N
            if param.shape[0] != need:
                raise KgenError(
                    e.loc,
                    f"vector '{e.name}' has length {param.shape[0]} but "
                    f"{e.name}[{e.axis.value}] needs length {need}",
                )
