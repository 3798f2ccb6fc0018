"""The transformer rules of a loop: `loop NAME over DIM { schedule lines, carries, gemms }`,
and the kernel's `packed DIM by OFFSETS` lines (packed variable-length sequences).

`LoopRules` is a base of kgen/parse_tree.py's ToIR. A loop's parts are read here (its tile
`MxN`, its warps `W` or `Wx1`, its stages, its carries with their initial values); its gemms are
read by the gemm rule and resolved with the kernel's names in ToIR.kernel, which assembles the
ir.Loop. The parser refuses what it cannot represent (a carry without an initial value or not
`[row]`, a setting given twice); kgen/verify/loops.py checks the rest.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from lark import Token, v_args

from . import ir
from .diagnostics import at_line, check_identifier, checked_int, number_text, quote
from .errors import KgenError, SourceLoc
from .language import F32_MAX, MAX_SETTING
from .parse_expr import ExpressionRules

__all__ = ["LoopRules", "LoopDecl", "Setting"]


@dataclass(frozen=True)
class Setting:
    """One line of a kernel, loop or gemm body: target, compute, tile, warps, stages, keep,
    epilogue."""

    kind: str
    value: object
    loc: SourceLoc


@dataclass(frozen=True)
class LoopDecl:
    """A loop as read, before its gemms are resolved against the kernel's names."""

    name: str
    dim: str
    settings: dict  # kind -> _Setting (tile, warps, stages)
    carries: tuple[ir.Carry, ...]
    gemms: tuple  # parse_tree._GemmDecl, in order
    loc: SourceLoc
    carried: dict[str, SourceLoc] = field(default_factory=dict)  # carries and accumulators


@v_args(meta=True)
class LoopRules(ExpressionRules):
    """Rules for `loop`, `carry`, the loop's own schedule lines and its `blocks` line."""

    def loop_tile(self, meta, children):
        m, n = self._sizes(children[0], "tile", ("M", "N"), "two sizes MxN (rows x block)")
        loc = self._loc(meta)
        return Setting("tile", ir.BlockShape(m, n, loc), loc)

    def loop_warps(self, meta, children):
        (value,) = children
        loc = self._loc(meta)
        if isinstance(value, Token):  # `warps 4x1`
            m, n = self._sizes(value, "warps", ("M", "N"), "a count W (or Wx1)")
        else:  # `warps 4`
            m, n = checked_int(value.text, "warps", MAX_SETTING, value.loc), 1
        return Setting("warps", ir.WarpGrid(m, n, loc), loc)

    def loop_blocks(self, meta, children):
        shape, names = (children[0], children[1:]) if children[0].type == "SHAPE" else (
            None, children)
        m, n = (self._sizes(shape, "blocks", ("M", "N"), "two sizes MxN (rows x block)")
                if shape is not None else (None, None))
        for token in names:
            check_identifier(str(token), self._loc(token), "block mask")
        loc = self._loc(meta)
        full = (str(names[2]), str(names[3])) if len(names) == 4 else (None, None)
        return Setting("blocks", ir.BlockMask(m, n, str(names[0]), str(names[1]), *full, loc),
                       loc)

    def carry_init(self, meta, children):
        text = "".join(str(t) for t in children)
        loc = self._loc(meta)
        word = str(children[-1])
        if children[-1].type == "NAME" and word != "inf":
            raise KgenError(
                self._loc(children[-1]),
                f"a carry starts at a number, inf or -inf, not {quote(word)}",
            )
        value = float(text)
        named = children[-1].type == "NAME"  # inf, -inf: the only infinities
        if math.isnan(value) or (not named and not math.isfinite(value)) or (
                math.isfinite(value) and abs(value) > F32_MAX):
            raise KgenError(loc, f"initial value {number_text(text)} does not fit in f32")
        return value, loc

    def carry(self, meta, children):
        name_token, dtype_token, axis_token, *init = children
        name, loc = str(name_token), self._loc(meta)
        check_identifier(name, self._loc(name_token), "carry")
        dtype = self._dtype(dtype_token)
        if str(axis_token) != "row":
            raise KgenError(
                self._loc(axis_token),
                f"a carry holds one value per row: write {dtype.dsl_name}[row], "
                f"not {dtype.dsl_name}[{axis_token}]",
            )
        if not init:
            raise KgenError(
                loc,
                f"carry '{name}' needs an initial value, e.g. "
                f"'carry {name} : {dtype.dsl_name}[row] = 0'",
            )
        return ir.Carry(name, dtype, init[0][0], loc)

    def loop(self, meta, children):
        name_token, dim_token, *items = children
        name, loc = str(name_token), self._loc(meta)
        check_identifier(name, self._loc(name_token), "loop")
        settings: dict = {}
        carries: list[ir.Carry] = []
        gemms: list = []
        for item in items:
            if isinstance(item, ir.Carry):
                carries.append(item)
            elif isinstance(item, Setting):  # a schedule line
                if item.kind in settings:
                    first = settings[item.kind].loc
                    raise KgenError(
                        item.loc,
                        f"{item.kind} given twice in loop '{name}' (first{at_line(first)})",
                    )
                settings[item.kind] = item
            else:
                gemms.append(item)
        carried: dict[str, SourceLoc] = {}
        for carry in carries:
            carried.setdefault(carry.name, carry.loc)
        for decl in gemms:
            if decl.accumulate:
                carried.setdefault(decl.name, decl.loc)
        return LoopDecl(name, str(dim_token), settings, tuple(carries), tuple(gemms), loc,
                        carried)

    def packed(self, meta, children):
        dim_token, offsets_token = children
        check_identifier(str(offsets_token), self._loc(offsets_token), "offsets vector")
        return ir.Packed(str(dim_token), str(offsets_token), self._loc(meta))

    def _sizes(self, token: Token, what: str, axes: tuple, needs: str) -> list[int]:
        """Split `128x128x32` into checked integers, each error pointing at its own number."""
        parts = [(m.group(), m.start()) for m in re.finditer(r"[^xX \t]+", str(token))]
        if len(parts) != len(axes):
            raise KgenError(self._loc(token), f"{what} needs {needs}, got {number_text(token)}")
        values = []
        for axis, (text, offset) in zip(axes, parts):
            col = token.column + offset
            loc = SourceLoc(self.file, token.line, col, token.line, col + len(text))
            values.append(checked_int(text, f"{what} {axis}", MAX_SETTING, loc))
        return values
