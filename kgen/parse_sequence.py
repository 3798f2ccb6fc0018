"""The transformer rules of a sequence: `sequence NAME { workspace A, B  launch K ... }`.

`SequenceRules` is a base of kgen/parse_tree.py's ToIR (and LoopRules one of its). The parser reads the names and refuses
what it alone can know (an unsafe name, a workspace name given twice, a sequence that launches
nothing); the kernels a sequence launches and the buffers its kernels share are checked against
the whole module by kgen/verify/sequence.py.
"""
from __future__ import annotations

from lark import v_args

from . import ir
from .diagnostics import at_line, check_identifier
from .errors import KgenError
from .parse_loop import LoopRules

__all__ = ["SequenceRules"]


@v_args(meta=True)
class SequenceRules(LoopRules):
    """Rules for `sequence`, `workspace` and `launch` (over the loops' and expressions')."""

    def workspace(self, meta, tokens):
        buffers = []
        seen: dict[str, ir.WorkspaceBuffer] = {}
        for token in tokens:
            loc = self._loc(token)
            check_identifier(str(token), loc, "workspace buffer")
            if str(token) in seen:
                raise KgenError(loc, f"workspace buffer '{token}' is named twice (first"
                                     f"{at_line(seen[str(token)].loc)})")
            seen[str(token)] = buffer = ir.WorkspaceBuffer(str(token), loc)
            buffers.append(buffer)
        return tuple(buffers)

    def launch(self, meta, children):
        (token,) = children
        check_identifier(str(token), self._loc(token), "kernel")
        return ir.Launch(str(token), self._loc(token))

    def sequence(self, meta, children):
        name_token, *items = children
        name, loc = str(name_token), self._loc(meta)
        check_identifier(name, self._loc(name_token), "sequence")
        launches: list[ir.Launch] = []
        workspace: list[ir.WorkspaceBuffer] = []
        for item in items:
            if isinstance(item, ir.Launch):
                launches.append(item)
                continue
            for buffer in item:  # a workspace line: every name once over all the lines
                first = next((b for b in workspace if b.name == buffer.name), None)
                if first is not None:
                    raise KgenError(buffer.loc, f"workspace buffer '{buffer.name}' is named "
                                                f"twice (first{at_line(first.loc)})")
                workspace.append(buffer)
        if not launches:
            raise KgenError(self._loc(name_token), f"sequence '{name}' launches no kernel; add "
                                                   "e.g. 'launch my_kernel'")
        return ir.Sequence(name, tuple(launches), tuple(workspace), loc)
