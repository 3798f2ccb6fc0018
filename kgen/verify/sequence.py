"""A sequence's checks, and what it means: its buffers, parameters and workspace.

`resolve(module, sequence)` checks one `sequence` against the module's kernels and returns a
`SequenceInfo`, the one description of the sequence the runtime (kgen/runtime/sequence.py),
the emitter (kgen/sequence.py) and `kgen inspect` read; `check_sequences(module)` runs it for
each sequence of a module (kgen.verify calls it once the kernels are accepted).

The rules, each refused at the user's line:
- the sequence's name is a safe identifier, no kernel's, and no other sequence's;
- it launches kernels of the module, each once, tile programs (loop or row kernels), not over
  packed sequences and without a block mask (not yet), all for one target (the .cu is compiled
  for it);
- a name two launched kernels declare is one buffer: kind, dtype, shape (dimension by dimension,
  as written) and layout agree; two scalars of one name agree in dtype and default;
- a buffer a kernel writes is not one an earlier kernel read before any kernel wrote it (the
  sequence's inputs are only read), and it is added into (`out accumulate`) by every kernel that
  writes it or by none; by one kernel at most, since each kernel's launch zeroes its
  `out accumulate` outputs (a second kernel adding into it would lose the first one's sums);
- a workspace buffer is a tensor (row-major) or vector some launched kernel declares, written
  by a kernel before any reads it, read by a later kernel, and sized by the parameters: each of its
  dimensions is a number or a dimension of a parameter that is no workspace.
A size name means one size across the sequence's kernels.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir
from ..diagnostics import at_line, check_identifier, did_you_mean, quote, shape_text, shown
from ..errors import NOWHERE, KgenError, SourceLoc
from ..ir import ParamKind, Role

__all__ = ["Buffer", "SequenceInfo", "check_sequences", "resolve"]


@dataclass(frozen=True, slots=True)
class Buffer:
    """One name of the sequence: a parameter of the sequence, or a workspace buffer.
    `param` is its first declaration (kind, dtype, shape, layout, default); `written`: some
    launched kernel writes it; `added_by`: the launch (index) of the one kernel that adds into
    it (`out accumulate`; that kernel's launch zeroes it first), None when none does."""

    name: str
    param: ir.Param
    workspace: bool
    written: bool
    added_by: int | None = None

    @property
    def kind(self) -> ParamKind:
        return self.param.kind

    @property
    def accumulate(self) -> bool:
        return self.added_by is not None


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    """A checked sequence: its kernels in launch order and its buffers in the order the
    kernels first declare them."""

    sequence: ir.Sequence
    kernels: tuple[ir.Kernel, ...]
    buffers: tuple[Buffer, ...]

    @property
    def name(self) -> str:
        return self.sequence.name

    @property
    def target(self) -> ir.Arch:
        return self.kernels[0].target

    @property
    def params(self) -> tuple[Buffer, ...]:
        """The sequence's parameters (every buffer but the workspace), in order."""
        return tuple(b for b in self.buffers if not b.workspace)

    @property
    def workspace(self) -> tuple[Buffer, ...]:
        """The workspace buffers, in the order the `workspace` line names them."""
        by_name = {b.name: b for b in self.buffers}
        return tuple(by_name[w.name] for w in self.sequence.workspace)

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        """The parameters some kernel writes: what a call returns, in order."""
        return tuple(b for b in self.params if b.written)

    def buffer(self, name: str) -> Buffer | None:
        return next((b for b in self.buffers if b.name == name), None)

    @property
    def dims(self) -> tuple[str, ...]:
        """The size names of the parameters, in order of first appearance."""
        out: list[str] = []
        for b in self.params:
            out += [d for d in b.param.full_shape if isinstance(d, str) and d not in out]
        return tuple(out)


def check_sequences(module: ir.Module) -> None:
    """Check every sequence of `module` (whose kernels verify accepted)."""
    sequences = module.sequences
    if not isinstance(sequences, tuple):
        raise KgenError(NOWHERE, f"a module's sequences must be a tuple, got {shown(sequences)}")
    seen: dict[str, SourceLoc] = {}
    for sequence in sequences:
        if not isinstance(sequence, ir.Sequence):
            raise KgenError(NOWHERE, f"a module's sequences are kgen.ir.Sequence, got "
                                     f"{shown(sequence)}")
        if sequence.name in seen:
            raise KgenError(sequence.loc, f"duplicate sequence name {quote(sequence.name)} "
                                          f"(first defined{at_line(seen[sequence.name])})")
        resolve(module, sequence)
        seen[sequence.name] = sequence.loc


def resolve(module: ir.Module, sequence: ir.Sequence) -> SequenceInfo:
    """The checked SequenceInfo of `sequence`; KgenError at the first problem."""
    check_identifier(sequence.name, sequence.loc, "sequence")
    clash = module.kernel(sequence.name)
    if clash is not None:
        raise KgenError(sequence.loc, f"sequence {quote(sequence.name)} has the name of a "
                                      f"kernel (defined{at_line(clash.loc)}); the .cu names "
                                      "both the same way: rename one")
    for attr in ("launches", "workspace"):
        if not isinstance(getattr(sequence, attr), tuple):
            raise KgenError(sequence.loc, f"sequence {attr} must be a tuple, got "
                                          f"{shown(getattr(sequence, attr))}")
    if not sequence.launches:
        raise KgenError(sequence.loc, f"sequence {quote(sequence.name)} launches no kernel")
    kernels = _kernels(module, sequence)
    workspace = {w.name: w for w in sequence.workspace}
    state = _Walk(sequence, workspace)
    for index, kernel in enumerate(kernels):
        for param in kernel.params:
            state.declare(index, kernel, param)
    return state.finish(kernels)


def _kernels(module: ir.Module, sequence: ir.Sequence) -> tuple[ir.Kernel, ...]:
    """The launched kernels in order, each checked as a kernel a sequence can launch."""
    out: list[ir.Kernel] = []
    first: dict[str, SourceLoc] = {}
    for launch in sequence.launches:
        if not isinstance(launch, ir.Launch):
            raise KgenError(sequence.loc, f"a sequence launches kgen.ir.Launch, got "
                                          f"{shown(launch)}")
        kernel = module.kernel(launch.kernel)
        if kernel is None:
            names = [k.name for k in module.kernels]
            raise KgenError(launch.loc, f"no kernel named {quote(launch.kernel)} in this file"
                                        f"{did_you_mean(str(launch.kernel), names)}")
        if launch.kernel in first:
            raise KgenError(launch.loc, f"kernel '{launch.kernel}' is launched twice (first"
                                        f"{at_line(first[launch.kernel])}); a sequence launches "
                                        "each kernel once")
        first[launch.kernel] = launch.loc
        if kernel.loop is None and (kernel.gemms or kernel.epilogue is None):
            raise KgenError(launch.loc, f"kernel '{kernel.name}' is a gemm kernel; a sequence "
                                        "launches tile programs (loop kernels and row kernels)")
        if kernel.packed:
            raise KgenError(launch.loc, f"kernel '{kernel.name}' runs over packed sequences "
                                        f"(line {kernel.packed[0].loc.line}); a sequence does "
                                        "not launch packed kernels yet")
        if kernel.loop is not None and kernel.loop.blocks is not None:
            raise KgenError(launch.loc, f"kernel '{kernel.name}' has a block mask (line "
                                        f"{kernel.loop.blocks.loc.line}); a sequence does not "
                                        "launch a kernel with a block mask yet (its lists are "
                                        "no parameter of the sequence): load it as a program")
        if out and kernel.target is not out[0].target:
            raise KgenError(launch.loc, f"kernel '{kernel.name}' targets {kernel.target.value}, "
                                        f"kernel '{out[0].name}' {out[0].target.value}: the "
                                        "kernels of a sequence share one target (its .cu is "
                                        "compiled for it)")
        out.append(kernel)
    return tuple(out)


def _described(p: ir.Param) -> str:
    text = f"{p.kind.value} {p.dtype.dsl_name}"
    if p.kind is not ParamKind.SCALAR:
        text += shape_text(p.full_shape)
    if p.kind is ParamKind.TENSOR:
        text += f" {p.layout.value}"
    return text


class _Walk:
    """The launches' parameters in order: each name's first declaration, who reads and writes
    it, and which launch adds into it."""

    def __init__(self, sequence: ir.Sequence, workspace: dict[str, ir.WorkspaceBuffer]):
        self.sequence = sequence
        self.workspace = workspace
        self.first: dict[str, tuple[ir.Param, ir.Kernel]] = {}
        self.read_first: dict[str, tuple[ir.Param, ir.Kernel]] = {}  # read before any write
        self.writes: dict[str, tuple[ir.Param, ir.Kernel]] = {}  # the first write
        self.read_after_write: set[str] = set()
        self.added_by: dict[str, tuple[int, ir.Param, ir.Kernel]] = {}  # `out accumulate`
        self.default: dict[str, float | None] = {}

    def declare(self, index: int, kernel: ir.Kernel, param: ir.Param) -> None:
        name = param.name
        first = self.first.get(name)
        if first is None:
            self.first[name] = (param, kernel)
            self.default[name] = param.default
        else:
            self._agree(first, param, kernel)
        if param.role is Role.OUT:
            self._write(index, kernel, param)
        elif name in self.writes:
            self.read_after_write.add(name)
        else:
            self.read_first.setdefault(name, (param, kernel))

    def _agree(self, first: tuple[ir.Param, ir.Kernel], param: ir.Param,
               kernel: ir.Kernel) -> None:
        old, owner = first
        same = (old.kind is param.kind and old.dtype is param.dtype
                and old.full_shape == param.full_shape
                and (param.kind is not ParamKind.TENSOR or old.layout is param.layout))
        if not same:
            raise KgenError(param.loc, f"'{param.name}' of kernel '{kernel.name}' is "
                                       f"{_described(param)}, but kernel '{owner.name}' declares "
                                       f"it {_described(old)}{at_line(old.loc)}: one name is one "
                                       f"buffer in sequence '{self.sequence.name}'")
        if param.default is not None:
            known = self.default[param.name]
            if known is not None and known != param.default:
                raise KgenError(param.loc, f"scalar '{param.name}' defaults to {param.default:g} "
                                           f"in kernel '{kernel.name}' but to {known:g} in an "
                                           "earlier kernel of the sequence; give them one "
                                           "default")
            self.default[param.name] = param.default

    def _write(self, index: int, kernel: ir.Kernel, param: ir.Param) -> None:
        name = param.name
        if name in self.read_first:
            reader, by = self.read_first[name]
            raise KgenError(param.loc, f"kernel '{kernel.name}' writes '{name}', which kernel "
                                       f"'{by.name}' reads before{at_line(reader.loc)}: a "
                                       "sequence's inputs are only read (write it under "
                                       "another name)")
        earlier = self.writes.get(name)
        if earlier is not None and earlier[0].accumulate != param.accumulate:
            adds, plain = (param, earlier[0]) if param.accumulate else (earlier[0], param)
            raise KgenError(param.loc, f"'{name}' is written by kernel '{earlier[1].name}'"
                                       f"{at_line(earlier[0].loc)} and by kernel "
                                       f"'{kernel.name}', one adding into it ('out accumulate'"
                                       f"{at_line(adds.loc)}) and one not{at_line(plain.loc)}: "
                                       "the kernels that write a buffer all add into it, or "
                                       "none does")
        adder = self.added_by.get(name)
        if adder is not None:
            _, first, by = adder
            raise KgenError(param.loc, f"kernel '{kernel.name}' adds into '{name}', which kernel "
                                       f"'{by.name}' already adds into{at_line(first.loc)}: each "
                                       "kernel's launch zeroes its 'out accumulate' outputs, so "
                                       f"the sums of kernel '{by.name}' would be lost (add into "
                                       "another buffer and sum the two in a later kernel)")
        self.writes.setdefault(name, (param, kernel))
        if param.accumulate:
            self.added_by[name] = (index, param, kernel)

    def finish(self, kernels: tuple[ir.Kernel, ...]) -> SequenceInfo:
        sized = {d for name, (p, _) in self.first.items() if name not in self.workspace
                 and p.kind is not ParamKind.SCALAR for d in p.full_shape}
        for name, buffer in self.workspace.items():
            if name not in self.first:
                known = [n for n, (p, _) in self.first.items() if p.kind is not ParamKind.SCALAR]
                raise KgenError(buffer.loc, f"workspace buffer '{name}' is no parameter of the "
                                            f"launched kernels{did_you_mean(name, known)}")
            param, kernel = self.first[name]
            if param.kind is ParamKind.SCALAR:
                raise KgenError(buffer.loc, f"'{name}' is a scalar (kernel '{kernel.name}'"
                                            f"{at_line(param.loc)}); a workspace holds tensors "
                                            "and vectors")
            if name in self.read_first:
                reader, by = self.read_first[name]
                raise KgenError(buffer.loc, f"workspace buffer '{name}' is read by kernel "
                                            f"'{by.name}'{at_line(reader.loc)} before any kernel "
                                            "writes it; a workspace starts undefined (make it a "
                                            "parameter of the sequence)")
            if name not in self.read_after_write:
                raise KgenError(buffer.loc, f"workspace buffer '{name}' is written and never "
                                            "read by a later kernel; it would be lost (make it a "
                                            "parameter of the sequence)")
            if param.kind is ParamKind.TENSOR and param.layout is not ir.Layout.ROW:
                raise KgenError(buffer.loc, f"workspace tensor '{name}' is declared "
                                            f"'{param.layout.value}'{at_line(param.loc)}; the "
                                            "workspace holds row-major tensors")
            for dim in param.full_shape:
                if isinstance(dim, str) and dim not in sized:
                    raise KgenError(buffer.loc, f"workspace buffer '{name}' has dimension "
                                                f"'{dim}', which no parameter of the sequence has"
                                                ": the launcher sizes the workspace from the "
                                                "parameters")
        buffers = []
        for name, (param, _) in self.first.items():
            if param.default != self.default[name]:  # the default an earlier kernel lacked
                param = dataclasses.replace(param, default=self.default[name])
            adder = self.added_by.get(name)
            buffers.append(Buffer(name, param, name in self.workspace, name in self.writes,
                                  None if adder is None else adder[0]))
        return SequenceInfo(self.sequence, kernels, tuple(buffers))
