"""The Lark transformer: a .kg file's parse tree to kgen IR, every node carrying its location.

`ToIR(file).transform(tree)` returns the kernels and the sequences. Declarations (kernel settings, parameters,
gemms and their settings, phases, storage; a loop's own parts are kgen/parse_loop.py's, its gemms
and the kernel's epilogue are resolved here) are checked for what the parser alone can know:
names given twice, missing settings, options that do not apply, sizes out of range, unsafe
identifiers. Epilogue expressions come from kgen/parse_expr.py as resolvers, called once the
kernel's names are all known; kgen.verify checks the rest.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from lark import Token, v_args

from . import ir
from .diagnostics import (
    ARCH_NAMES,
    at_line,
    check_identifier,
    checked_int,
    number_text,
    or_list,
    quote,
)
from .errors import KgenError, SourceLoc
from .ir import Arch, DType, ParamKind, Residency
from .language import F32_MAX, MAX_ALIGN, MAX_DIM, MAX_SETTING
from .parse_expr import Resolver, Scope
from .parse_loop import LoopDecl
from .parse_loop import Setting as _Setting
from .parse_sequence import SequenceRules

__all__ = ["ToIR"]

# ---------------------------------------------------------------------------------------------
# Pieces the transformer hands upwards before a kernel is assembled


@dataclass(frozen=True)
class _Number:
    """A signed number as written, for settings, dimensions and defaults."""

    text: str
    loc: SourceLoc


def _value(setting: _Setting | None):
    """A setting's value; None where the gemm leaves the line out (kgen fills it)."""
    return None if setting is None else setting.value


@dataclass(frozen=True)
class _Persistent:
    members: tuple
    loc: SourceLoc


@dataclass(frozen=True)
class _Keep:
    residency: Residency
    stage: str | None  # `keep g0 in smem` names the stage
    stage_loc: SourceLoc | None


@dataclass(frozen=True)
class _Stmt:
    target: str
    target_loc: SourceLoc
    value: Resolver
    loc: SourceLoc
    scale: bool = False  # `o *= r`
    add: bool = False  # `dQ += expr` (ir.Store.accumulate)


@dataclass(frozen=True)
class _GemmDecl:
    name: str
    name_loc: SourceLoc
    a: ir.OperandRef
    b: ir.OperandRef
    acc_dtype: DType
    settings: dict[str, _Setting]
    loc: SourceLoc
    accumulate: bool = False  # `gemm o += s @ V`


_SETTING_EXAMPLES = {  # the settings a gemm must write (kgen fills its schedule lines)
    "epilogue": "epilogue { D = acc }",
}


# ---------------------------------------------------------------------------------------------
# The transformer


@v_args(meta=True)
class ToIR(SequenceRules):
    """Kernels, parameters, gemms, phases and storage; loops are LoopRules', sequences
    SequenceRules', expressions ExpressionRules'."""

    # -- kernels -------------------------------------------------------------------------------

    def start(self, meta, items):
        """(kernels, sequences), each in source order."""
        kernels = tuple(i for i in items if isinstance(i, ir.Kernel))
        return kernels, tuple(i for i in items if isinstance(i, ir.Sequence))

    def kernel_name(self, meta, children):
        (token,) = children
        check_identifier(str(token), self._loc(token), "kernel")
        return str(token), self._loc(token)

    def target(self, meta, children):
        (token,) = children
        arch = Arch.from_name(str(token))
        if arch is None:
            raise KgenError(
                self._loc(token), f"unknown target {quote(token)}; expected {ARCH_NAMES}"
            )
        return _Setting("target", arch, self._loc(meta))

    def compute(self, meta, children):
        (token,) = children
        dtype = self._dtype(token)
        return _Setting("compute", dtype, self._loc(meta))

    def reductions(self, meta, children):
        (token,) = children
        if str(token) not in ("atomic", "deterministic"):
            raise KgenError(
                self._loc(token),
                f"unknown reduction mode {quote(token)}; expected atomic or deterministic",
            )
        return _Setting("reductions", str(token) == "deterministic", self._loc(meta))

    def schedule(self, meta, children):
        (token,) = children
        schedule = ir.Schedule.from_name(str(token))
        if schedule is None:
            names = or_list([s.value for s in ir.Schedule])
            raise KgenError(self._loc(token), f"unknown schedule {quote(token)}; expected {names}")
        return _Setting("schedule", schedule, self._loc(meta))

    def kernel(self, meta, children):
        (name, name_loc), *items = children
        settings: dict[str, _Setting] = {}
        params: list[ir.Param] = []
        decls: list[_GemmDecl] = []
        loop: LoopDecl | None = None
        packed: list[ir.Packed] = []
        for item in items:
            if isinstance(item, ir.Packed):
                packed.append(item)
            elif isinstance(item, _Setting):
                if item.kind in settings:
                    first = settings[item.kind].loc
                    raise KgenError(item.loc, f"{item.kind} given twice (first{at_line(first)})")
                settings[item.kind] = item
            elif isinstance(item, ir.Param):
                params.append(item)
            elif isinstance(item, LoopDecl):
                if loop is not None:
                    raise KgenError(
                        item.loc, f"a kernel holds one loop (the first is '{loop.name}'"
                                  f"{at_line(loop.loc)})"
                    )
                if "epilogue" in settings:
                    raise KgenError(
                        settings["epilogue"].loc,
                        f"the kernel's epilogue runs after loop '{item.name}'"
                        f"{at_line(item.loc)}: write it below the loop",
                    )
                loop = item
            else:
                decls.append(item)
        if "target" not in settings:
            raise KgenError(name_loc, f"kernel '{name}' has no target; add e.g. 'target sm_80'")

        by_name: dict[str, ir.Param] = {}
        for param in params:
            by_name.setdefault(param.name, param)
        dims = {d for p in params for d in p.full_shape if isinstance(d, str)}
        loop_decls = loop.gemms if loop is not None else ()
        gemm_names = {d.name for d in (*decls, *loop_decls)}
        carried = dict(loop.carried) if loop is not None else {}
        other_locals: dict[str, str] = {}
        loop_values: dict[str, SourceLoc] = {}  # read by the loop's later epilogues
        loop_rows = {d.name: (d.a.name, d.b.name) for d in loop_decls
                     if not d.accumulate and d.a.name not in by_name}

        def resolve(decl: _GemmDecl, earlier: list, in_loop: bool) -> ir.Gemm:
            values = loop_values if in_loop else {}
            scope = Scope(by_name, gemm_names, dims,
                          {n: g for n, g in other_locals.items() if n not in values},
                          {**carried, **values}, carried=set(carried),
                          stores_readable=in_loop, sizes=in_loop, loop_rows=loop_rows)
            gemm = self._gemm_ir(decl, scope, {g.name for g in earlier})
            if in_loop and gemm.scales:
                raise KgenError(gemm.scales[0].loc, "block scales apply to a kernel's FP8 gemm, "
                                "not to a loop's gemms")
            bound = {n: at for n, at in scope.bound.items() if n not in carried}
            other_locals.update({n: decl.name for n in bound
                                 if n not in gemm_names and n not in values})
            if in_loop:
                loop_values.update(bound)
            return gemm

        gemms: list[ir.Gemm] = []
        for decl in decls:
            gemms.append(resolve(decl, gemms, False))
        loop_ir = None
        if loop is not None:
            loop_gemms: list[ir.Gemm] = []
            for decl in loop.gemms:
                loop_gemms.append(resolve(decl, [*gemms, *loop_gemms], True))
            loop_ir = ir.Loop(
                name=loop.name, dim=loop.dim, carries=loop.carries, gemms=tuple(loop_gemms),
                tile=_value(loop.settings.get("tile")), warps=_value(loop.settings.get("warps")),
                stages=_value(loop.settings.get("stages")), loc=loop.loc,
                blocks=_value(loop.settings.get("blocks")),
            )
        epilogue = None
        if "epilogue" in settings:  # the kernel's own: after the loop, or a row kernel's body
            scope = Scope(by_name, gemm_names, dims, dict(other_locals), dict(carried),
                          carried=set(carried), sizes=True, loop_rows=loop_rows,
                          loop_locals=set(loop_values))
            stmts = self._statements(settings["epilogue"].value, scope)
            epilogue = ir.Epilogue(stmts, settings["epilogue"].loc)

        compute = settings.get("compute")
        phases = settings.get("phases")
        storage = settings.get("storage")
        return ir.Kernel(
            name=name,
            target=settings["target"].value,
            params=tuple(params),
            gemms=tuple(gemms),
            compute_dtype=compute.value if compute else DType.F32,
            loc=self._loc(meta),
            target_loc=settings["target"].loc,
            phases=phases.value if phases else (),
            storage=storage.value if storage else None,
            deterministic=settings["reductions"].value if "reductions" in settings else False,
            schedule=settings["schedule"].value if "schedule" in settings else None,
            schedule_loc=settings["schedule"].loc if "schedule" in settings else name_loc,
            loop=loop_ir,
            epilogue=epilogue,
            packed=tuple(packed),
        )

    # -- parameters ----------------------------------------------------------------------------

    def param_kind(self, meta, children):
        return ParamKind(str(children[0]))

    def shape(self, meta, dims):
        return tuple(dims)

    def dim(self, meta, children):
        (value,) = children
        if isinstance(value, Token):
            check_identifier(str(value), self._loc(value), "dimension")
            return str(value)
        return checked_int(value.text, "dimension", MAX_DIM, value.loc)

    def signed_number(self, meta, children):
        return _Number("".join(str(t) for t in children), self._loc(meta))

    def modifier(self, meta, children):
        return _Setting("modifier", str(children[0]), self._loc(meta))

    def default(self, meta, children):
        (value,) = children
        if isinstance(value, Token):  # `= nan`, `= inf`, `= alpha`
            return _Setting("default", (str(value), None), self._loc(value))
        try:
            number = float(value.text)
        except ValueError:  # not reachable with the grammar's NUMBER, but never crash
            number = None
        return _Setting("default", (value.text, number), value.loc)

    def param(self, meta, children):
        kind, name_token, dtype_token, *rest = children
        name, loc = str(name_token), self._loc(meta)
        check_identifier(name, self._loc(name_token), kind.value)
        dtype = self._dtype(dtype_token)
        shape: tuple = ()
        if rest and isinstance(rest[0], tuple):
            shape, rest = rest[0], rest[1:]
        batch = heads = None
        batched_rank = {ParamKind.TENSOR: 3, ParamKind.VECTOR: 2, ParamKind.SCALAR: 1}[kind]
        # a leading batch dimension: f16[L, M, K], f32[L, N], and f32[L] (one scalar per batch)
        if len(shape) == batched_rank:
            batch, shape = shape[0], shape[1:]
        # two: batch and heads, bf16[B, H, S, D] and f32[B, H, S] (loop and row kernels)
        elif len(shape) == batched_rank + 1 and kind is not ParamKind.SCALAR:
            batch, heads, shape = shape[0], shape[1], shape[2:]
        layout = role = default = None
        accumulate = positive = False
        for option in rest:
            if option.kind == "default":
                if default is not None:
                    raise KgenError(option.loc, f"'{name}' already has a default")
                text, default = option.value
                if default is None or not math.isfinite(default) or abs(default) > F32_MAX:
                    raise KgenError(
                        option.loc,
                        f"default of {kind.value} '{name}' must be a finite f32 number, "
                        f"got {number_text(text)}",
                    )
            elif option.value in ("row", "col"):
                if kind is not ParamKind.TENSOR:
                    raise KgenError(
                        option.loc, f"only tensors have a layout; '{name}' is a {kind.value}"
                    )
                if layout is not None:
                    raise KgenError(
                        option.loc, f"tensor '{name}' already has layout '{layout.value}'"
                    )
                layout = ir.Layout(option.value)
            elif option.value == "accumulate":  # `out accumulate`: verify checks the rest
                if accumulate:
                    raise KgenError(option.loc, f"'{name}' is already marked 'accumulate'")
                accumulate = True
            elif option.value == "positive":  # verify checks the kind, dtype and default
                if positive:
                    raise KgenError(option.loc, f"'{name}' is already marked 'positive'")
                positive = True
            else:
                if role is not None:
                    raise KgenError(
                        option.loc, f"{kind.value} '{name}' is already marked '{role.value}'"
                    )
                role = ir.Role(option.value)
        return ir.Param(
            name=name,
            kind=kind,
            dtype=dtype,
            shape=shape,
            layout=layout or ir.Layout.ROW,
            role=role or ir.Role.IN,
            default=default,
            loc=loc,
            batch=batch,
            heads=heads,
            accumulate=accumulate,
            positive=positive,
        )

    # -- gemm stages ---------------------------------------------------------------------------

    def gemm_name(self, meta, children):
        (token,) = children
        check_identifier(str(token), self._loc(token), "gemm")
        return str(token), self._loc(token)

    def operand(self, meta, children):
        token, *transpose = children
        if transpose and str(transpose[0]) != "T":
            raise KgenError(
                self._loc(transpose[0]),
                f"'^' after an operand takes T (the transpose, as in {token}^T), "
                f"not {quote(transpose[0])}",
            )
        return ir.OperandRef(str(token), self._loc(meta), transposed=bool(transpose))

    def gemm_op(self, meta, children):
        return str(children[0])

    def accumulate(self, meta, children):
        return self._dtype(children[0])

    def tile(self, meta, children):
        m, n, k = self._sizes(children[0], "tile", ("M", "N", "K"), "three sizes MxNxK")
        return _Setting("tile", ir.TileShape(m, n, k, self._loc(meta)), self._loc(meta))

    def warps(self, meta, children):
        m, n = self._sizes(children[0], "warps", ("M", "N"), "two counts MxN")
        return _Setting("warps", ir.WarpGrid(m, n, self._loc(meta)), self._loc(meta))

    def stages(self, meta, children):
        (number,) = children
        count = checked_int(number.text, "stages", MAX_SETTING, number.loc)
        return _Setting("stages", ir.StageCount(count, self._loc(meta)), self._loc(meta))

    def split(self, meta, children):
        (number,) = children
        if isinstance(number, Token):  # a name: only `split stream`
            if str(number) != "stream":
                raise KgenError(self._loc(number), "split takes a count of parts or 'stream' "
                                f"(stream-K), not '{number}'")
            return _Setting("split", ir.SplitK(1, self._loc(meta), stream=True), self._loc(meta))
        count = checked_int(number.text, "split", MAX_SETTING, number.loc)
        return _Setting("split", ir.SplitK(count, self._loc(meta)), self._loc(meta))

    def cluster(self, meta, children):
        m, n = self._sizes(children[0], "cluster", ("M", "N"), "two counts MxN")
        return _Setting("cluster", ir.ClusterShape(m, n, self._loc(meta)), self._loc(meta))

    def residency(self, meta, children):
        return Residency(str(children[0]))

    def keep(self, meta, children):
        *stage, residency = children
        stage_name = str(stage[0]) if stage else None
        stage_loc = self._loc(stage[0]) if stage else None
        return _Setting("keep", _Keep(residency, stage_name, stage_loc), self._loc(meta))

    def resident(self, meta, children):
        (operand,) = children
        return _Setting("resident", (str(operand), self._loc(operand)), self._loc(meta))

    def block_scale(self, meta, children):
        operand, param, block = children
        rows, k = self._sizes(block, "scale", ("block rows", "block K"), "a block RxK, e.g. 1x128")
        scale = ir.BlockScale(str(operand), str(param), (rows, k), self._loc(meta),
                              self._loc(param))
        return _Setting(f"scale {operand}", scale, self._loc(meta))

    def epilogue(self, meta, stmts):
        return _Setting("epilogue", tuple(stmts), self._loc(meta))

    def stmt(self, meta, children):
        target, value = children
        return _Stmt(str(target), self._loc(target), value, self._loc(meta))

    def scale_stmt(self, meta, children):
        target, value = children
        return _Stmt(str(target), self._loc(target), value, self._loc(meta), scale=True)

    def add_stmt(self, meta, children):
        target, value = children
        return _Stmt(str(target), self._loc(target), value, self._loc(meta), add=True)

    def gemm(self, meta, children):
        (name, name_loc), op, a, b, *rest = children
        acc_dtype = DType.F32
        if rest and isinstance(rest[0], DType):
            acc_dtype, rest = rest[0], rest[1:]
        settings: dict[str, _Setting] = {}
        for item in rest:
            if item.kind in settings:
                first = settings[item.kind].loc
                raise KgenError(
                    item.loc,
                    f"{item.kind} given twice in gemm '{name}' (first{at_line(first)})",
                )
            settings[item.kind] = item
        accumulate = op == "+="
        for kind, example in _SETTING_EXAMPLES.items():
            if kind not in settings and not accumulate:  # `o += s @ V` has no epilogue
                raise KgenError(
                    name_loc, f"gemm '{name}' has no {kind} setting; add e.g. '{example}'"
                )
        return _GemmDecl(name, name_loc, a, b, acc_dtype, settings, self._loc(meta),
                         accumulate)

    def _gemm_ir(self, decl: _GemmDecl, scope: Scope, earlier: set[str]) -> ir.Gemm:
        """Resolve a gemm's epilogue against the kernel's names and build the ir.Gemm."""
        keep = decl.settings.get("keep")
        if keep is not None:
            if decl.a.name not in earlier:
                raise KgenError(
                    keep.loc, "keep applies only to a gemm whose A operand is an earlier gemm"
                )
            if keep.value.stage is not None and keep.value.stage != decl.a.name:
                raise KgenError(
                    keep.value.stage_loc,
                    f"keep names '{keep.value.stage}' but the A operand of gemm '{decl.name}' "
                    f"is '{decl.a.name}'",
                )
        resident = decl.settings.get("resident")
        if resident is not None:
            operand, operand_loc = resident.value
            if operand != decl.b.name:
                raise KgenError(
                    operand_loc,
                    f"keep {operand} resident: the B operand of gemm '{decl.name}' is "
                    f"'{decl.b.name}' (only a gemm's B can stay resident)",
                )

        epilogue = decl.settings.get("epilogue")
        if epilogue is None:  # an accumulating gemm: no epilogue of its own
            epilogue = _Setting("epilogue", (), decl.loc)
        stmts = self._statements(epilogue.value, scope)

        return ir.Gemm(
            name=decl.name,
            a=decl.a,
            b=decl.b,
            acc_dtype=decl.acc_dtype,
            tile=_value(decl.settings.get("tile")),
            warps=_value(decl.settings.get("warps")),
            stages=_value(decl.settings.get("stages")),
            epilogue=ir.Epilogue(tuple(stmts), epilogue.loc),
            keep=keep.value.residency if keep is not None else None,
            resident=resident is not None,
            resident_loc=resident.loc if resident is not None else None,
            loc=decl.loc,
            split=_value(decl.settings.get("split")),
            cluster=_value(decl.settings.get("cluster")),
            accumulate=decl.accumulate,
            scales=tuple(s.value for kind, s in decl.settings.items()
                         if kind.startswith("scale ")),
        )

    def _statements(self, stmts: tuple, scope: Scope) -> tuple[ir.Stmt, ...]:
        """One epilogue's statements, in order: `name = expr` stores to a parameter or a gemm
        (the value the gemm hands on), updates a carried value (`scope.carried`: a loop's
        carries and accumulators), or binds a local."""
        def sets_param_or_gemm(stmt: _Stmt) -> bool:
            return stmt.target in scope.params or (
                stmt.target in scope.gemms and stmt.target not in scope.carried)

        for s in stmts:
            if not sets_param_or_gemm(s) and s.target not in scope.carried:
                scope.later.setdefault(s.target, s.loc)
        out: list[ir.Stmt] = []
        for s in stmts:
            value = s.value(scope)
            if s.scale and s.target not in scope.carried:
                raise KgenError(
                    s.target_loc,
                    f"'{s.target} *= ...' rescales a carried value (a loop's carry or "
                    f"accumulator); '{s.target}' is not one: write '{s.target} = ...'",
                )
            if s.scale:
                value = ir.Call(ir.Op.MUL, (ir.LocalRef(s.target, s.target_loc), value), s.loc)
            if s.add:
                if s.target not in scope.params:
                    raise KgenError(
                        s.target_loc,
                        f"'{s.target} += ...' adds into an output tensor declared 'out "
                        f"accumulate'; '{s.target}' is not a parameter",
                    )
                out.append(ir.Store(s.target, value, s.loc, accumulate=True))
            elif s.target in scope.carried:
                out.append(ir.Update(s.target, value, s.loc))
            elif sets_param_or_gemm(s):
                out.append(ir.Store(s.target, value, s.loc))
                if scope.stores_readable and s.target in scope.gemms:
                    scope.bound.setdefault(s.target, s.loc)
            else:
                check_identifier(s.target, s.target_loc, "local")
                out.append(ir.Let(s.target, value, s.loc))
                scope.bound.setdefault(s.target, s.loc)
        return tuple(out)

    # -- phases and storage ----------------------------------------------------------------------

    def phase(self, meta, children):
        if len(children) == 1:  # a user phase; `gemm.mainloop` is checked against the gemms
            check_identifier(str(children[0]), self._loc(children[0]), "phase")
        name = ".".join(str(t) for t in children)
        return ir.Phase(name, self._loc(meta))

    def phases(self, meta, children):
        return _Setting("phases", tuple(children), self._loc(meta))

    def live_range(self, meta, children):
        first, *last = children
        return ir.LiveRange(first.name, (last[0] if last else first).name, self._loc(meta))

    def live(self, meta, children):
        return _Setting("live", tuple(children), self._loc(meta))

    def align(self, meta, children):
        (number,) = children
        value = checked_int(number.text, "align", MAX_ALIGN, number.loc)
        return _Setting("align", value, self._loc(meta))

    def buffer(self, meta, children):
        name_token, dtype_token, shape, *options = children
        name, loc = str(name_token), self._loc(meta)
        check_identifier(name, self._loc(name_token), "buffer")
        dtype = self._dtype(dtype_token)
        if not shape:
            raise KgenError(loc, f"buffer '{name}' needs at least one dimension")
        for dim in shape:
            if not isinstance(dim, int):
                raise KgenError(
                    loc, f"buffer '{name}' has dimension '{dim}'; shared-memory buffers have "
                         "fixed sizes, such as f16[64, 64]"
                )
        seen: dict[str, _Setting] = {}
        for option in options:
            if option.kind in seen:
                raise KgenError(
                    option.loc, f"buffer '{name}' has two {option.kind} options "
                                f"(first{at_line(seen[option.kind].loc)})"
                )
            seen[option.kind] = option
        live, align = seen.get("live"), seen.get("align")
        return ir.SmemBuffer(name, dtype, tuple(shape), live.value if live else (),
                             align.value if align else None, loc)

    def buffer_ref(self, meta, children):
        (token,) = children
        return ir.BufferRef(str(token), self._loc(meta))

    def stage_kind(self, meta, children):
        return ir.StageKind(str(children[0]))

    def stage_ref(self, meta, children):
        *label, kind, gemm = children
        if label:
            check_identifier(str(label[0]), self._loc(label[0]), "storage member")
        return ir.StageBuffers(kind, str(gemm), str(label[0]) if label else None, self._loc(meta))

    def union(self, meta, members):
        return ir.Union(tuple(members), self._loc(meta))

    def struct(self, meta, members):
        return ir.Struct(tuple(members), self._loc(meta))

    def persistent(self, meta, members):
        return _Persistent(tuple(members), self._loc(meta))

    def storage(self, meta, items):
        loc = self._loc(meta)
        persistent: tuple = ()
        roots, packed = [], []
        for item in items:
            if isinstance(item, _Persistent):
                if roots or persistent:
                    raise KgenError(item.loc, "persistent { ... } must come first in storage, "
                                              "once")
                persistent = item.members
            elif isinstance(item, ir.SmemBuffer):
                packed.append(item)
            else:
                roots.append(item)
        root = roots[0] if len(roots) == 1 else (ir.Struct(tuple(roots), loc) if roots else None)
        decl = ir.StorageDecl(persistent, root, tuple(packed), loc)
        return _Setting("storage", decl, loc)
