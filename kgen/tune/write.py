"""`kgen tune --write`: the winning schedule lines written into the .kg text, every other byte
(comments, blank lines, layout, line endings) kept.

Positions come from the parsed kernel's source locations: a gemm's lines go right after its
`{` (on a line of their own, indented like the line after it, or inline when the block is on one
line), `schedule ...` after the kernel's `target` line. With `replace` (`kgen tune --all-lines`)
the lines the source writes are rewritten in place, or deleted (with their line when nothing
else is on it) when the winner has no such line. `keep <stage> in registers|smem` carries no
location in the IR: it is found in the gemm's own text, outside its epilogue and comments.

`checked` re-parses the new text and requires it to plan to the very kernel that was tuned
(the same emitted source): the .cu that `kgen compile` makes from the written file is the tuned
one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import ir
from ..errors import KgenRuntimeError, SourceLoc
from ..plan import LineChoice

# the order of a gemm's lines: one line of tile, warps, stages, split and cluster, then keep,
# resident
_FIRST_LINE = ("tile", "warps", "stages", "split", "cluster")
_OWN_LINES = ("keep", "resident")
_KEEP = re.compile(r"\bkeep\s+(?:\w+\s+in\s+)?(?:registers|smem)\b")


def setting_text(what: str, value: str) -> str:
    """A filled line as DSL text: ("tile", "128x256x64") -> "tile 128x256x64"."""
    if what in ("split", "keep", "resident"):
        return value  # LineChoice holds the whole setting: "split 4", "keep B0 resident"
    return f"{what} {value}"


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int
    end: int
    text: str


class _Text:
    """Offsets of line/column positions in one text."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for i, ch in enumerate(text):
            if ch == "\n":
                self.starts.append(i + 1)

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col - 1

    def span(self, loc: SourceLoc) -> tuple[int, int]:
        return self.offset(loc.line, loc.col), self.offset(loc.end_line, loc.end_col)

    def line_of(self, offset: int) -> int:
        """0-based index of the line holding `offset`."""
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def line_bounds(self, index: int) -> tuple[int, int]:
        """[start, end) of line `index` without its "\\n" (a "\\r" before it stays inside)."""
        start = self.starts[index]
        end = self.starts[index + 1] - 1 if index + 1 < len(self.starts) else len(self.text)
        return start, end

    def newline(self, index: int) -> str:
        start, end = self.line_bounds(index)
        return "\r\n" if end > start and self.text[end - 1] == "\r" else "\n"

    def rest_is_blank(self, offset: int) -> bool:
        """Only spaces or a comment between `offset` and the end of its line."""
        _, end = self.line_bounds(self.line_of(offset))
        rest = self.text[offset:end].strip()
        return not rest or rest.startswith("#")


def _mask(text: str, start: int, end: int, holes: list[tuple[int, int]]) -> str:
    """text[start:end] with comments and the `holes` spans blanked, offsets kept."""
    chars = list(text[start:end])
    for hole_start, hole_end in holes:
        for i in range(max(hole_start, start), min(hole_end, end)):
            chars[i - start] = " "
    in_comment = False
    for i, ch in enumerate(chars):
        if ch == "\n":
            in_comment = False
        elif ch == "#":
            in_comment = True
        if in_comment:
            chars[i] = " "
    return "".join(chars)


def _body_open(t: _Text, gemm: ir.Gemm) -> int:
    """The offset of the `{` that opens the gemm's body (the header holds no brace)."""
    start, end = t.span(gemm.loc)
    masked = _mask(t.text, start, end, [])
    return start + masked.index("{")


def _keep_span(t: _Text, gemm: ir.Gemm) -> tuple[int, int] | None:
    open_at = _body_open(t, gemm)
    _, end = t.span(gemm.loc)
    masked = _mask(t.text, open_at + 1, end, [t.span(gemm.epilogue.loc)])
    found = _KEEP.search(masked)
    if found is None:
        return None
    return open_at + 1 + found.start(), open_at + 1 + found.end()


def _written(t: _Text, kernel: ir.Kernel, gemm: ir.Gemm) -> dict[str, tuple[int, int]]:
    """The schedule settings the source writes in `gemm`: kind -> span."""
    spans: dict[str, tuple[int, int]] = {}
    for what in _FIRST_LINE:
        setting = getattr(gemm, what)
        if setting is not None:
            spans[what] = t.span(setting.loc)
    if gemm.resident and gemm.resident_loc is not None:
        spans["resident"] = t.span(gemm.resident_loc)
    if gemm.keep is not None:
        keep = _keep_span(t, gemm)
        if keep is not None:
            spans["keep"] = keep
    return spans


def _indent(t: _Text, line_index: int) -> str:
    start, end = t.line_bounds(line_index)
    line = t.text[start:end]
    return line[:len(line) - len(line.lstrip(" \t"))]


def _insert_after(t: _Text, offset: int, texts: list[str], fallback_indent: str,
                  limit: int) -> _Edit:
    """Insert `texts` after `offset`: as new lines after its line when the rest of that line is
    blank (indented like the next line with content before `limit`), else inline."""
    if not t.rest_is_blank(offset):
        after = "" if t.text[offset:offset + 1] in (" ", "\t") else " "
        return _Edit(offset, offset, " " + "  ".join(texts) + after)
    index = t.line_of(offset)
    newline = t.newline(index)
    indent = fallback_indent
    for following in range(index + 1, len(t.starts)):
        start, end = t.line_bounds(following)
        if start >= limit:
            break
        if t.text[start:end].strip():
            indent = _indent(t, following)
            break
    _, end = t.line_bounds(index)
    at = end + 1 if end < len(t.text) else end
    lead = "" if end < len(t.text) else newline
    body = "".join(f"{indent}{text}{newline}" for text in texts)
    return _Edit(at, at, lead + body)


def _deletions(t: _Text, spans: list[tuple[int, int]]) -> list[_Edit]:
    """Delete `spans`: a line left with nothing but spaces goes whole; otherwise each span and
    the spaces after it (before it, when only spaces follow it on its line)."""
    by_line: dict[int, list[tuple[int, int]]] = {}
    for span in spans:
        by_line.setdefault(t.line_of(span[0]), []).append(span)
    edits = []
    for index, line_spans in sorted(by_line.items()):
        start, end = t.line_bounds(index)
        if not _mask(t.text, start, end, line_spans).strip():
            edits.append(_Edit(start, end + 1 if end < len(t.text) else end, ""))
            continue
        gone: set[int] = set()
        for s, e in line_spans:
            after = e
            while after < end and t.text[after] in " \t":
                after += 1
            if not t.text[after:end].strip():  # last on its line
                before = s
                while before > start and t.text[before - 1] in " \t":
                    before -= 1
                gone.update(range(before, e))
            else:
                gone.update(range(s, after))
        run_start = None
        for i in range(start, end + 1):
            if i in gone and run_start is None:
                run_start = i
            elif i not in gone and run_start is not None:
                edits.append(_Edit(run_start, i, ""))
                run_start = None
    return edits


def write_lines(text: str, kernel: ir.Kernel, lines: tuple[LineChoice, ...], *,
                replace: bool = False) -> str:
    """`text` (the file `kernel` was parsed from) with the schedule `lines` written in.
    Without `replace` the lines must be ones the source leaves out (they are added); with it,
    they are the kernel's whole schedule and the written ones are rewritten or deleted."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    t = _Text(text[len(bom):])
    wanted: dict[str, dict[str, str]] = {}  # gemm -> what -> text ("schedule" under "")
    for choice in lines:
        if choice.line == "schedule":
            wanted.setdefault("", {})["schedule"] = setting_text("schedule", choice.value)
            continue
        gemm, _, what = choice.line.partition(" ")
        wanted.setdefault(gemm, {})[what] = setting_text(what, choice.value)

    edits: list[_Edit] = []
    deleted: list[tuple[int, int]] = []
    schedule_text = wanted.get("", {}).get("schedule")
    if replace and kernel.schedule is not None:
        span = t.span(kernel.schedule_loc)
        if schedule_text is not None:
            edits.append(_Edit(*span, schedule_text))
            schedule_text = None
        else:
            deleted.append(span)
    elif schedule_text is not None and kernel.schedule is not None:
        raise ValueError("the source writes `schedule`; write_lines would add a second one")
    if schedule_text is not None:
        _, target_end = t.span(kernel.target_loc)
        kernel_start, kernel_end = t.span(kernel.loc)
        edits.append(_insert_after(t, target_end, [schedule_text],
                                   _indent(t, t.line_of(kernel_start)) + "  ", kernel_end))

    for gemm in kernel.gemms:
        new = dict(wanted.get(gemm.name, {}))
        written = _written(t, kernel, gemm)
        for what, span in written.items():
            if not replace:
                if what in new:
                    raise ValueError(f"the source writes {gemm.name}'s {what}; pass replace=True")
                continue
            if what in new:
                edits.append(_Edit(*span, new.pop(what)))
            else:
                deleted.append(span)
        if not new:
            continue
        texts = []
        first = [new[w] for w in _FIRST_LINE if w in new]
        if first:
            texts.append("  ".join(first))
        texts += [new[w] for w in _OWN_LINES if w in new]
        open_at = _body_open(t, gemm)
        _, gemm_end = t.span(gemm.loc)
        edits.append(_insert_after(t, open_at + 1, texts,
                                   _indent(t, t.line_of(open_at)) + "  ", gemm_end))

    edits += _deletions(t, deleted)
    out = t.text
    for edit in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        out = out[:edit.start] + edit.text + out[edit.end:]
    return bom + out


def checked(new_text: str, file: str, kernel_name: str, arch: ir.Arch, expected_source: str,
            source_name: str, source_hash: str) -> None:
    """Raise KgenRuntimeError unless `new_text` parses, verifies and plans for `arch` to a
    kernel whose emitted source is `expected_source` (a kgen bug: the file is then not
    written)."""
    from ..lower import lower
    from ..parse import parse
    from ..verify import verify
    from .space import emit_source

    module = parse(new_text, file)
    verify(module)
    kernel = next(k for k in module.kernels if k.name == kernel_name)
    source = emit_source(lower(kernel, arch), source_name, source_hash)
    if source != expected_source:
        raise KgenRuntimeError(f"internal error: {file} with the tuned lines written does not plan "
                               "to the tuned kernel; the file is left as it was")
