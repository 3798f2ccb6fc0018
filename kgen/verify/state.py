"""The verifier's state while it walks one kernel, and the small checks every topic shares.

One `KernelState` per kernel: the names defined so far (so a duplicate is reported against the
first), the parameters, the gemms checked so far and what they feed, each local's gemm, the
outputs written, and the warnings collected on the way. The topic modules (params, gemms,
epilogue, storage) read and fill it in source order.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import at_line, check_identifier, shown
from ..errors import KgenError, KgenWarning, SourceLoc


class KernelState:
    """What the verifier knows about one kernel so far."""

    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.target = None
        self.names: dict[str, tuple[str, SourceLoc]] = {}  # every defined name: (kind, loc)
        self.params: dict[str, ir.Param] = {}
        self.gemm_shapes: dict[str, tuple] = {}  # checked gemms -> (M, N) of their output
        self.consumer: dict[str, ir.Gemm] = {}  # gemm name -> the later gemm it feeds
        self.local_owner: dict[str, str] = {}  # local name -> its gemm
        self.written: dict[str, SourceLoc] = {}  # output param -> its store
        self.warnings: list[KgenWarning] = []  # collected, in source order; never raised
        # the kernel's batch dimension: (dim, the first batched parameter, its location)
        self.batch: tuple[object, str, SourceLoc] | None = None

    def define(self, name: str, kind: str, loc: SourceLoc) -> None:
        check_identifier(name, loc, kind)
        if name in self.names:
            first_kind, first_loc = self.names[name]
            raise KgenError(
                loc,
                f"duplicate name '{name}' (first defined{at_line(first_loc)} as a {first_kind})",
            )
        self.names[name] = (kind, loc)

    def consumer_names(self) -> set[str]:
        return {name for h in self.kernel.gemms if isinstance(name := a_name(h), str)}

    def consumer_of(self, name: str) -> ir.Gemm:
        return next(h for h in self.kernel.gemms if a_name(h) == name)


def require_str(value: object, loc: SourceLoc, what: str) -> str:
    if not isinstance(value, str):
        raise KgenError(loc, f"{what} must be a string, got {shown(value)}")
    return value


def a_name(gemm: object) -> object:
    """The A operand's name of something that should be a Gemm, or None."""
    return getattr(getattr(gemm, "a", None), "name", None)
