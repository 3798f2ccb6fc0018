"""The DSL front end: `.kg` text to kgen IR, every node carrying its source location.

`parse(text, file)` runs the Lark grammar in grammar/kgen.lark (LALR, built once per process)
and one Transformer that turns the tree into `kgen.ir`. Names inside an epilogue are resolved
against the kernel's parameters once the whole kernel is read, so the transformer returns small
resolver functions for expressions and the `kernel` rule calls them.

Every user mistake leaves as one `KgenError(loc, message)`: Lark's exceptions are translated here
(`raise ... from None`) into messages such as "expected an operator, a new line, ';' or '}',
found 'foo'". The parser refuses what it cannot represent or resolve (unknown names, dtypes and
targets, bad numbers, unsafe identifiers, missing settings); `kgen.verify` checks the rest.
"""
from __future__ import annotations

import functools
import os
import importlib.resources
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError

from . import ir
from .errors import KgenError, SourceLoc
from .ir import Arch, Axis, DType, Op, ParamKind, Residency
from .diagnostics import (
    ARCH_NAMES,
    DTYPE_NAMES,
    arity_message,
    at_line,
    check_identifier,
    checked_int,
    did_you_mean,
    number_text,
    or_list,
    quote,
)
from .language import F32_MAX, MAX_ALIGN, MAX_DIM, MAX_EXPR_DEPTH, MAX_SETTING, REDUCTIONS

__all__ = ["parse", "parse_file"]

# ---------------------------------------------------------------------------------------------
# The Lark parser, built once


def _grammar_text() -> str:
    local = Path(__file__).parent.parent / "grammar" / "kgen.lark"
    if local.is_file():
        return local.read_text(encoding="utf-8")
    return importlib.resources.files("kgen.grammar").joinpath("kgen.lark").read_text("utf-8")


# Tokens after which a new line cannot end a statement: the expression goes on.
_CONTINUES = frozenset("+ - * / < <= > >= == != = , ( [ {".split())
_OPEN = frozenset("([")
_CLOSE = frozenset(")]")


class _Separators:
    """Post-lexer: inside `epilogue { }` a new line or ';' ends a statement; elsewhere a new
    line is plain space. Separators are folded into one _SEP token; none is emitted inside
    brackets, after an operator or at the start of the block, so expressions can span lines."""

    always_accept = ("_NL", "SEMI", "NAME")

    def process(self, stream):
        in_epilogue = False
        opening = False  # saw `epilogue`, waiting for its `{`
        depth = 0  # ( and [ nesting inside the epilogue
        last = "{"  # value of the last token passed on, or "_SEP"
        for tok in stream:
            if tok.type in ("_NL", "SEMI"):
                if in_epilogue and depth == 0:
                    if last not in _CONTINUES and last != "_SEP":
                        last = "_SEP"
                        yield Token.new_borrow_pos("_SEP", tok.value, tok)
                    continue
                if tok.type == "_NL":
                    continue
            elif tok.type == "EPILOGUE":
                opening = True
            elif opening and tok.type == "LBRACE":
                in_epilogue, opening, depth = True, False, 0
            elif opening:  # `epilogue(g0)` in a storage block: not an epilogue body
                opening = False
            elif in_epilogue and tok.type not in ("NAME", "NUMBER"):
                if tok.value in _OPEN:
                    depth += 1
                elif tok.value in _CLOSE:
                    depth = max(depth - 1, 0)
                elif tok.value == "}" and depth == 0:
                    in_epilogue = False
            last = tok.value if tok.type != "_SEP" else "_SEP"
            yield tok


def _parser_cache_file() -> str | None:
    """Where the built LALR tables are kept between runs (building them costs ~0.2 s). The
    name hashes everything that shapes the parser: the grammar, this file (the post-lexer and
    the options) and lark's version, so a stale table is never loaded."""
    import hashlib
    import os

    import lark

    key = hashlib.sha256(
        _grammar_text().encode() + Path(__file__).read_bytes() + lark.__version__.encode()
    ).hexdigest()[:24]
    root = os.environ.get("KGEN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kgen")
    return os.path.join(root, f"parser-{key}.lark")


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    options = dict(
        parser="lalr",
        lexer="contextual",
        postlex=_Separators(),
        propagate_positions=True,
        maybe_placeholders=False,
    )
    try:
        cache = _parser_cache_file()
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        return Lark(_grammar_text(), cache=cache, **options)
    except Exception:  # an unwritable or damaged cache: build the tables in memory
        return Lark(_grammar_text(), **options)


# ---------------------------------------------------------------------------------------------
# Entry points


def parse(text: str, file: str = "<string>") -> ir.Module:
    """Parse kgen source text into a Module; raise KgenError on any mistake."""
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, file) from None
    _check_depth(tree, file)
    try:
        kernels = _ToIR(file).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, KgenError):
            raise e.orig_exc from None
        if isinstance(e.orig_exc, RecursionError):
            raise KgenError(_start_of(file), "expression nested too deeply") from None
        raise
    except RecursionError:
        raise KgenError(_start_of(file), "expression nested too deeply") from None
    return ir.Module(kernels=kernels, file=file)


def parse_file(path: str | Path) -> ir.Module:
    """Read and parse a .kg file; a file that cannot be read or decoded is a KgenError too."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise KgenError(SourceLoc(name, 0, 0, 0, 0), f"cannot read {name}: {e.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise KgenError(
            SourceLoc(name, line, col, line, col + 1),
            f"{name} is not UTF-8 text (byte 0x{data[e.start]:02x})",
        ) from None
    return parse(text, name)


def _check_depth(tree: Tree, file: str) -> None:
    """Refuse an epilogue expression nested deeper than MAX_EXPR_DEPTH, at its statement,
    before the (recursive) transformer walks it."""
    for stmt in tree.find_data("stmt"):
        stack = [(stmt.children[-1], 1)]
        while stack:
            node, depth = stack.pop()
            if not isinstance(node, Tree) or node.data == "axis":
                continue
            if depth > MAX_EXPR_DEPTH:
                meta = stmt.meta
                loc = SourceLoc(file, meta.line, meta.column, meta.end_line, meta.end_column)
                raise KgenError(
                    loc, f"expression nested too deeply (more than {MAX_EXPR_DEPTH} levels)"
                )
            stack.extend((child, depth + 1) for child in node.children)


def _start_of(file: str) -> SourceLoc:
    return SourceLoc(file, 1, 1, 1, 1)


# ---------------------------------------------------------------------------------------------
# Syntax errors: Lark's exceptions to one human sentence

_DECLARATIONS = ("target", "compute", "reductions", "schedule", "tensor", "vector", "scalar", "gemm", "phases", "storage")
_SETTINGS = ("tile", "warps", "stages", "keep", "epilogue")  # `keep B resident` starts as keep
_BINARY = frozenset("+ - * / < <= > >= == !=".split())
_COMPARISONS = frozenset("< <= > >= == !=".split())


def _syntax_error(e: UnexpectedInput, text: str, file: str) -> KgenError:
    if isinstance(e, UnexpectedCharacters):
        char = text[e.pos_in_stream]
        loc = SourceLoc(file, e.line, e.column, e.line, e.column + 1)
        return KgenError(loc, f"unexpected character {_describe_char(char)}")

    token = getattr(e, "token", None)
    expected = _expected_terminals(e)
    prev = _previous_token(e)
    if isinstance(e, UnexpectedEOF) or token is None or token.type == "$END":
        return KgenError(
            _end_of(text, file), f"unexpected end of file; expected {_phrase(expected, prev)}"
        )

    loc = SourceLoc(file, token.line, token.column, token.line, token.column + len(token.value))
    if token.type == "_SEP" and token.value == "\n":
        loc = SourceLoc(file, token.line, token.column, token.line, token.column + 1)
    value = str(token.value)
    literals = {_literal(name) for name in expected}
    if value in _COMPARISONS and "+" in literals and value not in literals:
        return KgenError(loc, "comparisons cannot be chained; add parentheses, as in (a < b) == c")
    if (
        value in _BINARY
        and prev is not None
        and prev.type == "_SEP"
        and prev.value == "\n"
        and value not in literals
    ):
        return KgenError(
            loc,
            f"a statement cannot start with '{value}'; to continue an expression on the next "
            "line, end the line with the operator",
        )
    message = f"expected {_phrase(expected, prev)}, found {_describe_token(token)}"
    start = token.start_pos or 0
    if (value == "/" and text[start + 1 : start + 2] in ("/", "*")) or (
        value == "*" and start > 0 and text[start - 1] == "/"
    ):
        message += " (comments start with '#')"
    elif value == "=" and "==" in literals:
        message += " (use '==' to compare)"
    return KgenError(loc, message)


def _expected_terminals(e: UnexpectedInput) -> set[str]:
    """The terminals the parser could really take here.

    Not `e.expected`: LALR merges states, so the table also lists tokens that are only valid in
    other contexts, and the contextual lexer adds its always-accepted ones. The interactive
    parser tries each candidate and keeps those that shift."""
    interactive = getattr(e, "interactive_parser", None)
    if interactive is not None:
        accepted = set(interactive.accepts())
        if "$END" in interactive.choices():
            accepted.add("$END")
        return accepted
    return set(getattr(e, "expected", None) or getattr(e, "allowed", None) or ())


def _previous_token(e: UnexpectedInput) -> Token | None:
    state = getattr(e, "state", None)
    stack = getattr(state, "value_stack", None) or []
    return stack[-1] if stack and isinstance(stack[-1], Token) else None


@functools.lru_cache(maxsize=None)
def _literal(terminal: str) -> str | None:
    """The fixed text of a terminal such as RBRACE ('}'), or None for patterns like NAME."""
    for term in _parser().terminals:
        if term.name == terminal:
            return term.pattern.value if term.pattern.type == "str" else None
    return None


def _phrase(expected: set[str], prev: Token | None) -> str:
    """What the parser wanted, in words: "a setting (tile, ...) or '}'"."""
    remaining = set(expected)
    by_literal = {_literal(name): name for name in expected if _literal(name) is not None}
    phrases: list[str] = []

    def take(names, phrase: str) -> None:
        remaining.difference_update(names)
        phrases.append(phrase)

    for words, kind in ((_DECLARATIONS, "a declaration"), (_SETTINGS, "a setting")):
        if set(words) <= by_literal.keys():
            take([by_literal[w] for w in words], f"{kind} ({or_list(list(words))})")
    if {"acc", "cast", "(", "-"} <= by_literal.keys():
        names = [by_literal[w] for w in ("acc", "cast", "(", "-")] + ["NAME", "NUMBER"]
        take(names, "an expression")
    if {"+", "*"} <= by_literal.keys():
        take([by_literal[w] for w in _BINARY if w in by_literal], "an operator")
    if {"NAME", "NUMBER"} <= remaining:
        after = prev.value if prev is not None else ""
        take(["NAME", "NUMBER", by_literal.get("-"), by_literal.get("+")],
             "a number" if after == "=" else "a dimension (a name or a number)")
    if "NAME" in remaining:
        if prev is not None and prev.type in ("LBRACE", "_SEP") and "RBRACE" in remaining:
            take(["NAME"], "a statement")
        else:
            take(["NAME"], _name_phrase(prev))
    if "SHAPE" in remaining:
        after = prev.value if prev is not None else ""
        shape = {"tile": "a tile shape such as 128x128x32", "warps": "a warp grid such as 2x2"}
        take(["SHAPE"], shape.get(after, "a shape such as 2x2"))
    if "NUMBER" in remaining:
        take(["NUMBER"], "a number")
    if "_SEP" in remaining:
        take(["_SEP"], "a new line")
        phrases.append("';'")

    natural = {"row": 0, "col": 1, "in": 2, "out": 3, "registers": 4, "smem": 5}

    def order(name: str):
        text = _literal(name) or name
        return name == "$END", name == "RBRACE", natural.get(text, len(natural)), text

    rest = sorted(remaining, key=order)
    for name in rest:
        text = _literal(name)
        phrases.append("the end of the file" if name == "$END" else f"'{text or name}'")
    return or_list(phrases) if phrases else "something else"


def _name_phrase(prev: Token | None) -> str:
    after = prev.value if prev is not None else ""
    if after == "kernel":
        return "a kernel name"
    if after == "gemm":
        return "a gemm name"
    if after in ("tensor", "vector", "scalar"):
        return f"a {after} name"
    if after in (":", "accumulate", "compute", "<"):
        return f"a dtype ({DTYPE_NAMES})"
    if after == "target":
        return f"a target ({ARCH_NAMES})"
    if after in ("=", "@"):
        return "an operand (a tensor or an earlier gemm)"
    if after == "keep":
        return "a gemm name, or a B operand"  # 'registers', 'smem' are listed beside it
    if after in ("..", ".", "live"):
        return "a phase name"
    return "a name"


def _describe_token(token: Token) -> str:
    if token.type == "_SEP" and token.value == "\n":
        return "a line break"
    value = str(token.value)
    if len(value) > 32:
        value = value[:29] + "..."
    return quote(value)


def _describe_char(char: str) -> str:
    if char.isprintable() and char.isascii():
        return f"'{char}'"
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" ({name})" if name else "")


def _end_of(text: str, file: str) -> SourceLoc:
    lines = text.rstrip().splitlines() or [""]
    line, col = len(lines), len(lines[-1]) + 1
    return SourceLoc(file, line, col, line, col + 1)


# ---------------------------------------------------------------------------------------------
# Pieces the transformer hands upwards before a kernel is assembled


@dataclass
class _Scope:
    """What a name in an epilogue can refer to, while one epilogue is being resolved."""

    params: dict[str, ir.Param]
    gemms: set[str]
    dims: set[str]
    other_locals: dict[str, str]  # local -> its gemm, from earlier epilogues
    bound: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound so far
    later: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound further down

    def unknown(self, name: str, loc: SourceLoc) -> KgenError:
        """The error for a name that is not a value here, saying what it is if anything."""
        if name in self.later:
            line = at_line(self.later[name])
            return KgenError(loc, f"'{name}' is used before it is defined{line}")
        if name in self.other_locals:
            return KgenError(
                loc,
                f"'{name}' is a local of gemm '{self.other_locals[name]}'; a local is visible "
                "only in its own epilogue",
            )
        if name in self.gemms:
            return KgenError(
                loc, f"'{name}' is a gemm; its output can only be the A operand of a later gemm"
            )
        if name in self.dims:
            return KgenError(loc, f"'{name}' is a dimension; sizes cannot be used in expressions")
        if name in ir.FUNCTIONS or name in REDUCTIONS:
            return KgenError(loc, f"'{name}' is a function; call it as {name}(...)")
        if name in ("row", "col"):
            return KgenError(loc, f"'{name}' can only be an index, as in bias[{name}]")
        candidates = ["acc", *self.params, *self.bound]
        return KgenError(loc, f"unknown name {quote(name)}{did_you_mean(name, candidates)}")


Resolver = Callable[[_Scope], ir.Expr]


@dataclass(frozen=True)
class _Literal:
    """A number literal: a resolver like any other, which unary minus folds into."""

    value: float
    text: str
    loc: SourceLoc

    def __call__(self, scope: _Scope) -> ir.Expr:
        if not math.isfinite(self.value) or abs(self.value) > F32_MAX:
            raise KgenError(self.loc, f"number {number_text(self.text)} does not fit in f32")
        return ir.Const(self.value, self.loc)


@dataclass(frozen=True)
class _Number:
    """A signed number as written, for settings, dimensions and defaults."""

    text: str
    loc: SourceLoc


@dataclass(frozen=True)
class _Setting:
    """One line of a kernel or gemm body: target, compute, tile, warps, stages, keep, epilogue."""

    kind: str
    value: object
    loc: SourceLoc


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


@dataclass(frozen=True)
class _GemmDecl:
    name: str
    name_loc: SourceLoc
    a: ir.OperandRef
    b: ir.OperandRef
    acc_dtype: DType
    settings: dict[str, _Setting]
    loc: SourceLoc


_SETTING_EXAMPLES = {
    "tile": "tile 128x128x32",
    "warps": "warps 2x2",
    "stages": "stages 3",
    "epilogue": "epilogue { D = acc }",
}


def _binary(op: Op):
    def rule(self, meta, children):
        left, right = children
        loc = self._loc(meta)
        return lambda scope: ir.Call(op, (left(scope), right(scope)), loc)

    return rule


# ---------------------------------------------------------------------------------------------
# The transformer


@v_args(meta=True)
class _ToIR(Transformer):
    def __init__(self, file: str):
        super().__init__(visit_tokens=False)
        self.file = file

    def _loc(self, node) -> SourceLoc:
        """The one place a Lark position (a rule's meta or a token) becomes a SourceLoc."""
        line = getattr(node, "line", None)
        if line is None or getattr(node, "empty", False):
            return SourceLoc(self.file, 0, 0, 0, 0)
        return SourceLoc(self.file, line, node.column, node.end_line, node.end_column)

    def _dtype(self, token: Token) -> DType:
        dtype = DType.from_name(str(token))
        if dtype is None:
            raise KgenError(
                self._loc(token), f"unknown dtype {quote(token)}; expected {DTYPE_NAMES}"
            )
        return dtype

    # -- kernels -------------------------------------------------------------------------------

    def start(self, meta, kernels):
        return tuple(kernels)

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
        for item in items:
            if isinstance(item, _Setting):
                if item.kind in settings:
                    first = settings[item.kind].loc
                    raise KgenError(item.loc, f"{item.kind} given twice (first{at_line(first)})")
                settings[item.kind] = item
            elif isinstance(item, ir.Param):
                params.append(item)
            else:
                decls.append(item)
        if "target" not in settings:
            raise KgenError(name_loc, f"kernel '{name}' has no target; add e.g. 'target sm_80'")

        by_name: dict[str, ir.Param] = {}
        for param in params:
            by_name.setdefault(param.name, param)
        dims = {d for p in params for d in p.shape if isinstance(d, str)}
        gemm_names = {d.name for d in decls}
        other_locals: dict[str, str] = {}
        gemms = []
        for decl in decls:
            scope = _Scope(by_name, gemm_names, dims, dict(other_locals))
            gemms.append(self._gemm_ir(decl, scope, {g.name for g in gemms}))
            other_locals.update({name: decl.name for name in scope.bound})

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
        layout = role = default = None
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
        )

    # -- gemm stages ---------------------------------------------------------------------------

    def gemm_name(self, meta, children):
        (token,) = children
        check_identifier(str(token), self._loc(token), "gemm")
        return str(token), self._loc(token)

    def operand(self, meta, children):
        return ir.OperandRef(str(children[0]), self._loc(meta))

    def accumulate(self, meta, children):
        return self._dtype(children[0])

    def tile(self, meta, children):
        m, n, k = self._sizes(children[0], "tile", ("M", "N", "K"), "three sizes MxNxK")
        return _Setting("tile", ir.TileShape(m, n, k, self._loc(meta)), self._loc(meta))

    def warps(self, meta, children):
        m, n = self._sizes(children[0], "warps", ("M", "N"), "two counts MxN")
        return _Setting("warps", ir.WarpGrid(m, n, self._loc(meta)), self._loc(meta))

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

    def stages(self, meta, children):
        (number,) = children
        count = checked_int(number.text, "stages", MAX_SETTING, number.loc)
        return _Setting("stages", ir.StageCount(count, self._loc(meta)), self._loc(meta))

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

    def epilogue(self, meta, stmts):
        return _Setting("epilogue", tuple(stmts), self._loc(meta))

    def stmt(self, meta, children):
        target, value = children
        return _Stmt(str(target), self._loc(target), value, self._loc(meta))

    def gemm(self, meta, children):
        (name, name_loc), a, b, *rest = children
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
        for kind, example in _SETTING_EXAMPLES.items():
            if kind not in settings:
                raise KgenError(
                    name_loc, f"gemm '{name}' has no {kind} setting; add e.g. '{example}'"
                )
        return _GemmDecl(name, name_loc, a, b, acc_dtype, settings, self._loc(meta))

    def _gemm_ir(self, decl: _GemmDecl, scope: _Scope, earlier: set[str]) -> ir.Gemm:
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

        epilogue = decl.settings["epilogue"]
        def sets_param_or_gemm(stmt: _Stmt) -> bool:
            return stmt.target in scope.params or stmt.target in scope.gemms

        for s in epilogue.value:
            if not sets_param_or_gemm(s):
                scope.later.setdefault(s.target, s.loc)
        stmts: list[ir.Stmt] = []
        for s in epilogue.value:
            value = s.value(scope)
            if sets_param_or_gemm(s):
                stmts.append(ir.Store(s.target, value, s.loc))
            else:
                check_identifier(s.target, s.target_loc, "local")
                stmts.append(ir.Let(s.target, value, s.loc))
                scope.bound.setdefault(s.target, s.loc)

        return ir.Gemm(
            name=decl.name,
            a=decl.a,
            b=decl.b,
            acc_dtype=decl.acc_dtype,
            tile=decl.settings["tile"].value,
            warps=decl.settings["warps"].value,
            stages=decl.settings["stages"].value,
            epilogue=ir.Epilogue(tuple(stmts), epilogue.loc),
            keep=keep.value.residency if keep is not None else None,
            resident=resident is not None,
            resident_loc=resident.loc if resident is not None else None,
            loc=decl.loc,
        )

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

    # -- expressions: each returns a Resolver ----------------------------------------------------

    lt = _binary(Op.LT)
    le = _binary(Op.LE)
    gt = _binary(Op.GT)
    ge = _binary(Op.GE)
    eq = _binary(Op.EQ)
    ne = _binary(Op.NE)
    add = _binary(Op.ADD)
    sub = _binary(Op.SUB)
    mul = _binary(Op.MUL)
    div = _binary(Op.DIV)

    def neg(self, meta, children):
        (arg,) = children
        loc = self._loc(meta)
        if isinstance(arg, _Literal):  # -2 is the constant -2, not neg(2)
            return _Literal(-arg.value, "-" + arg.text, loc)
        return lambda scope: ir.Call(Op.NEG, (arg(scope),), loc)

    def number(self, meta, children):
        (token,) = children
        return _Literal(float(token), str(token), self._loc(meta))

    def acc(self, meta, children):
        loc = self._loc(meta)
        return lambda scope: ir.Acc(loc)

    def name(self, meta, children):
        (token,) = children
        name, loc = str(token), self._loc(meta)

        def resolve(scope: _Scope) -> ir.Expr:
            if name in scope.bound:
                return ir.LocalRef(name, loc)
            param = scope.params.get(name)
            if param is None:
                raise scope.unknown(name, loc)
            if param.kind is ParamKind.SCALAR:
                return ir.ScalarLoad(name, loc)
            if param.kind is ParamKind.TENSOR:
                return ir.TensorLoad(name, loc)
            raise KgenError(
                loc, f"vector '{name}' needs an index: {name}[row] or {name}[col]"
            )

        return resolve

    def axis(self, meta, children):
        return Axis(str(children[0]))

    def index(self, meta, children):
        token, axis = children
        name, loc = str(token), self._loc(meta)

        def resolve(scope: _Scope) -> ir.Expr:
            param = scope.params.get(name)
            if param is not None and param.kind is ParamKind.VECTOR:
                return ir.VectorLoad(name, axis, loc)
            if param is not None:
                raise KgenError(
                    self._loc(token),
                    f"'{name}' is a {param.kind.value}; only vectors take an index",
                )
            if name in scope.bound:
                raise KgenError(
                    self._loc(token), f"'{name}' is a local; only vectors take an index"
                )
            raise scope.unknown(name, self._loc(token))

        return resolve

    def call(self, meta, children):
        token, *args = children
        name, loc, name_loc = str(token), self._loc(meta), self._loc(token)

        def resolve(scope: _Scope) -> ir.Expr:
            if name in ir.FUNCTIONS:
                op = ir.FUNCTIONS[name]
                if len(args) != op.arity:
                    raise KgenError(loc, arity_message(name, op.arity, len(args)))
                return ir.Call(op, tuple(arg(scope) for arg in args), loc)
            if name in REDUCTIONS:
                if len(args) != 1:
                    raise KgenError(loc, arity_message(name, 1, len(args)))
                op, axis = REDUCTIONS[name]
                return ir.Reduce(op, axis, args[0](scope), loc)
            param = scope.params.get(name)
            if param is not None:
                raise KgenError(
                    name_loc, f"'{name}' is a {param.kind.value}, not a function"
                )
            if name in scope.bound:
                raise KgenError(name_loc, f"'{name}' is a local, not a function")
            functions = [*ir.FUNCTIONS, *REDUCTIONS]
            raise KgenError(
                name_loc, f"unknown function {quote(name)}{did_you_mean(name, functions)}"
            )

        return resolve

    def cast(self, meta, children):
        dtype_token, arg = children
        loc = self._loc(meta)

        def resolve(scope: _Scope) -> ir.Expr:
            return ir.Cast(self._dtype(dtype_token), arg(scope), loc)

        return resolve
