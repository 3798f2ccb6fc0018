"""The DSL front end: `.kg` text to kgen IR, every node carrying its source location.

`parse(text, file)` runs the Lark grammar in grammar/kgen.lark (LALR, built once per process;
its tables are cached on disk only in a directory that no one else can write) and the
transformer of kgen/parse_tree.py, which turns the tree into `kgen.ir`. This module owns the
parser itself: the post-lexer that makes new lines end epilogue statements, the tables' cache,
the nesting limit checked before the recursive transformer runs, and the entry points.

Every user mistake leaves as one `KgenError(loc, message)`: Lark's exceptions are translated here
(`raise ... from None`), worded by kgen/syntax_errors.py ("expected an operator, a new line, ';'
or '}', found 'foo'"). The parser refuses what it cannot represent or resolve (unknown names,
dtypes and targets, bad numbers, unsafe identifiers, missing settings); `kgen.verify` checks the
rest.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput, VisitError

from . import ir
from .cachedir import is_private, private_dir
from .errors import KgenError, SourceLoc
from .language import MAX_EXPR_DEPTH
from .parse_tree import ToIR
from .syntax_errors import syntax_error

__all__ = ["parse", "parse_file"]

# ---------------------------------------------------------------------------------------------
# The Lark parser, built once


def _grammar_text() -> str:
    """The checkout's grammar/kgen.lark, else the installed package's (kgen/grammar: read as a
    file where it is one; importlib.resources, 4 ms of imports, only for a zipped install)."""
    here = Path(__file__).parent
    for local in (here.parent / "grammar" / "kgen.lark", here / "grammar" / "kgen.lark"):
        if local.is_file():
            return local.read_text(encoding="utf-8")
    import importlib.resources

    return importlib.resources.files("kgen.grammar").joinpath("kgen.lark").read_text("utf-8")


# Tokens after which a new line cannot end a statement: the expression goes on.
_CONTINUES = frozenset("+ - * / < <= > >= == != = *= , ( [ {".split())
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


def parser_cache_name() -> str:
    """The file name of the built LALR tables, kept between runs in the cache folder (building
    them costs ~50 ms, loading them ~6). The name hashes everything that shapes the parser: the
    grammar, this file (the post-lexer and the options) and lark's version, so a stale table is
    never loaded."""
    import hashlib

    import lark

    key = hashlib.sha256(
        _grammar_text().encode() + Path(__file__).read_bytes() + lark.__version__.encode()
    ).hexdigest()[:24]
    return f"parser-{key}.lark"


def _safe_cache_file() -> str | None:
    """The cache file, or None where loading it could run someone else's code: Lark's cache is
    a pickle, so it is used only in a directory that is ours and writable by no one else, and
    only if an existing file is ours and writable by no one else too (kgen/cachedir.py)."""
    folder = private_dir()
    if folder is None:
        return None
    path = os.path.join(folder, parser_cache_name())
    if os.path.lexists(path) and not is_private(path, directory=False):
        return None
    return path


def build_parser() -> Lark:
    """A new Lark parser, its tables loaded from or saved to a private cache when there is one."""
    options = dict(
        parser="lalr",
        lexer="contextual",
        postlex=_Separators(),
        propagate_positions=True,
        maybe_placeholders=False,
    )
    cache = _safe_cache_file()
    if cache is not None:
        try:
            return Lark(_grammar_text(), cache=cache, **options)
        except Exception:  # a damaged cache or a failed write: build the tables in memory
            pass
    return Lark(_grammar_text(), **options)


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return build_parser()


# ---------------------------------------------------------------------------------------------
# Entry points


def parse(text: str, file: str = "<string>") -> ir.Module:
    """Parse kgen source text into a Module; raise KgenError on any mistake."""
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise syntax_error(e, text, file, _parser().terminals) from None
    _check_depth(tree, file)
    try:
        kernels, sequences = ToIR(file).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, KgenError):
            raise e.orig_exc from None
        if isinstance(e.orig_exc, RecursionError):
            raise KgenError(_start_of(file), "expression nested too deeply") from None
        raise
    except RecursionError:
        raise KgenError(_start_of(file), "expression nested too deeply") from None
    return ir.Module(kernels=kernels, file=file, sequences=sequences)


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
    for stmt in tree.find_pred(lambda t: t.data in ("stmt", "scale_stmt")):
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
