"""Syntax errors: Lark's exceptions at the parse boundary, turned into one human sentence.

`syntax_error(e, text, file, terminals)` words what the parser wanted ("a setting (tile, warps,
stages, keep or epilogue) or '}'"), what it found ("a line break", "'foo'", "U+00A0 (NO-BREAK
SPACE)") and a hint for the usual slips (C comments, '=' for '==', chained comparisons, an
operator starting a line), located at the offending token. Only the phrasing lives here; the
parser (kgen/parse.py) decides when to call it.
"""
from __future__ import annotations

import unicodedata
from typing import Callable, Iterable

from lark import Token
from lark.lexer import TerminalDef
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from .diagnostics import ARCH_NAMES, DTYPE_NAMES, or_list, quote
from .errors import KgenError, SourceLoc

__all__ = ["syntax_error"]

Literal = Callable[[str], "str | None"]

_DECLARATIONS = (
    "target", "compute", "reductions", "schedule", "tensor", "vector", "scalar", "gemm", "phases",
    "storage", "loop", "epilogue", "packed",
)
# `keep B resident` starts as keep
_SETTINGS = ("tile", "warps", "stages", "split", "cluster", "keep", "scale", "epilogue")
_LOOP_ITEMS = ("tile", "warps", "stages", "blocks", "carry", "gemm")
_BINARY = frozenset("+ - * / < <= > >= == !=".split())
_COMPARISONS = frozenset("< <= > >= == !=".split())


def syntax_error(
    e: UnexpectedInput, text: str, file: str, terminals: Iterable[TerminalDef]
) -> KgenError:
    """The KgenError for a Lark parse failure; `terminals` are the parser's (for their text)."""
    fixed = {t.name: t.pattern.value if t.pattern.type == "str" else None for t in terminals}
    literal: Literal = fixed.get  # a terminal's fixed text ('}' for RBRACE), None for NAME
    if isinstance(e, UnexpectedCharacters):
        char = text[e.pos_in_stream]
        loc = SourceLoc(file, e.line, e.column, e.line, e.column + 1)
        return KgenError(loc, f"unexpected character {_describe_char(char)}")

    token = getattr(e, "token", None)
    expected = _expected_terminals(e)
    prev = _previous_token(e)
    if isinstance(e, UnexpectedEOF) or token is None or token.type == "$END":
        wanted = _phrase(expected, prev, literal)
        return KgenError(_end_of(text, file), f"unexpected end of file; expected {wanted}")

    loc = SourceLoc(file, token.line, token.column, token.line, token.column + len(token.value))
    if token.type == "_SEP" and token.value == "\n":
        loc = SourceLoc(file, token.line, token.column, token.line, token.column + 1)
    value = str(token.value)
    literals = {literal(name) for name in expected}
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
    message = f"expected {_phrase(expected, prev, literal)}, found {_describe_token(token)}"
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


def _phrase(expected: set[str], prev: Token | None, literal: Literal) -> str:
    """What the parser wanted, in words: "a setting (tile, ...) or '}'"."""
    remaining = set(expected)
    by_literal = {literal(name): name for name in expected if literal(name) is not None}
    phrases: list[str] = []

    def take(names, phrase: str) -> None:
        remaining.difference_update(names)
        phrases.append(phrase)

    for words, kind in ((_DECLARATIONS, "a declaration"), (_SETTINGS, "a setting"),
                        (_LOOP_ITEMS, "a loop item")):
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
        if "NUMBER" in remaining and after == "warps":  # a loop's warps: 4 or 4x1
            remaining.discard("NUMBER")
            remaining.difference_update(n for n in ("MINUS", "PLUS") if n in remaining)
            shape["warps"] = "a warp count such as 4"
        take(["SHAPE"], shape.get(after, "a shape such as 2x2"))
    if "NUMBER" in remaining:
        take(["NUMBER"], "a number")
    if "_SEP" in remaining:
        take(["_SEP"], "a new line")
        phrases.append("';'")

    natural = {"row": 0, "col": 1, "in": 2, "out": 3, "accumulate": 4, "positive": 5,
               "registers": 6, "smem": 7}

    def order(name: str):
        text = literal(name) or name
        return name == "$END", name == "RBRACE", natural.get(text, len(natural)), text

    rest = sorted(remaining, key=order)
    for name in rest:
        text = literal(name)
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
