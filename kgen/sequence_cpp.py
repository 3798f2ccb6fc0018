"""The values of a sequence's host launcher (templates/common/sequence_launcher.inc.j2).

Python decides here what each member of each kernel's params struct takes from the sequence's
params struct, as typed values the template substitutes: a member of the same name
(`Source("member")`), a workspace buffer's address, a kernel's own workspace (deterministic
mode's semaphores, after the buffers: `Source("own_workspace")`), a product of sizes (a contiguous
stride, a kernel's rows or batches), or a quotient of two sizes (GQA's group). The sequence's
params struct holds, per parameter of the sequence, its pointer (or scalar) and the stride
members its kernels take, then the sizes by name (`p.sizes.S`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .enums import ParamKind
from .errors import KgenError
from .runtime.sequence import WORKSPACE_ALIGN
from .targets.common.loop import CTYPES
from .verify.sequence import Buffer, SequenceInfo

__all__ = ["Factor", "Source", "launcher_values"]

# A stride member's suffix -> the axis of the full shape it steps along, counted from the end
# (a row-major tensor [.., rows, cols]: _ld along the rows) or from the start
_STRIDE_AXIS = {"_ld": -2, "_bs": 0, "_hs": 1}


@dataclass(frozen=True, slots=True)
class Factor:
    """One factor of a product: the size `dim` (`p.sizes.<dim>`), or the number `value`."""

    dim: str | None = None
    value: int = 1


@dataclass(frozen=True, slots=True)
class Source:
    """Where a member of a kernel's params struct comes from. `kind`: "member" (the sequence's
    member of the same name), "workspace" (buffer `buffer`'s address), "own_workspace" (the
    workspace kernel `buffer` takes itself, its `_workspace_bytes`), "product" (of
    `factors`; 1 when empty), "quotient" (factors[0] / factors[1])."""

    kind: str
    buffer: str = ""
    factors: tuple[Factor, ...] = ()


def _product(dims) -> tuple[Factor, ...]:
    return tuple(Factor(dim=d) if isinstance(d, str) else Factor(value=int(d)) for d in dims)


def _contiguous_stride(buffer: Buffer, suffix: str) -> tuple[Factor, ...]:
    """The stride `suffix` of a contiguous row-major buffer: the product of the dims after
    its axis."""
    shape = buffer.param.full_shape
    axis = _STRIDE_AXIS[suffix] % len(shape)
    return _product(shape[axis + 1:])


def _size_sources(kernel, plan) -> dict[str, Source]:
    """The size members of a kernel's params struct (rows, loop_len, heads, group, batches)."""
    def dim_of(value) -> Source:
        return Source("product", factors=_product((value,)))

    by_name = {p.name: p for p in kernel.params}
    own = [p for p in plan.params if p.name in by_name]  # not the buffers it zeroes for another
    queries = next((by_name[p.name].heads for p in own if p.headed and not p.kv), None)
    keys = next((by_name[p.name].heads for p in own if p.headed and p.kv), None)
    batch = next((by_name[p.name].batch for p in own if p.batched), None)
    heads = dim_of(queries if queries is not None else 1)
    out = {"rows": dim_of(plan.rows_dim),
           # a loop kernel's loop dimension, whatever its plan's kind (a row kernel has none)
           "loop_len": dim_of(getattr(plan, "loop_dim", None) or 0),
           "heads": heads,
           "group": (Source("quotient", factors=_product((queries, keys)))
                     if queries is not None and keys is not None else dim_of(1)),
           "batches": dim_of(batch if batch is not None else 1)}
    return out


def _kernel_members(info: SequenceInfo, kernel, plan) -> list[dict]:
    """What each member of one kernel's params struct takes, in the struct's order."""
    sizes = _size_sources(kernel, plan)
    out = []
    for f in plan.fields:
        ctype = "ptr" if f.ctype == "ptr" else CTYPES[f.ctype]
        if f.param is None and f.ctype == "ptr":  # the kernel's own workspace (semaphores)
            out.append(dict(name=f.name, ctype=ctype, element="int",
                            source=Source("own_workspace", buffer=kernel.name)))
            continue
        if f.param is None:
            if f.name not in sizes:  # a size member this launcher does not know how to fill
                raise KgenError(kernel.loc, f"kernel '{kernel.name}' takes '{f.name}' in its "
                                            "params struct, which a sequence's launcher cannot "
                                            "fill yet (it fills rows, loop_len, heads, group "
                                            "and batches)")
            source = sizes[f.name]
        else:
            buffer = info.buffer(f.param)
            if not buffer.workspace:
                source = Source("member")
            elif f.name == f.param:
                source = Source("workspace", buffer=buffer.name)
            else:
                source = Source("product",
                                factors=_contiguous_stride(buffer, f.name[len(f.param):]))
        out.append(dict(name=f.name, ctype=ctype, source=source,
                        element=plan.param(f.param).dtype.cpp if ctype == "ptr" else ""))
    return out


def _members(info: SequenceInfo, plans) -> list[dict]:
    """The sequence's params struct: per parameter its pointer or scalar, then the stride
    members its kernels take (in the order the first kernel that takes each has them)."""
    out = []
    for buffer in info.params:
        p = buffer.param
        fields = [f for plan in plans for f in plan.fields if f.param == p.name]
        if p.kind is ParamKind.SCALAR:
            out.append(dict(ctype=CTYPES[fields[0].ctype], name=p.name,
                            comment=f"scalar {p.name} ({p.dtype.dsl_name})"))
            continue
        const = "" if buffer.written else "const "
        out.append(dict(ctype=f"{const}{p.dtype.cpp}*", name=p.name,
                        comment=f"{p.kind.value} {p.name} ({p.dtype.dsl_name}, "
                                f"{'written' if buffer.written else 'read'})"))
        seen: list[str] = []
        for f in fields:
            if f.name != p.name and f.name not in seen:
                seen.append(f.name)
                what = {"_ld": "rows", "_bs": "batches", "_hs": "heads"}[f.name[len(p.name):]]
                out.append(dict(ctype="long long", name=f.name,
                                comment=f"{p.name}'s stride in elements: {what} apart"))
    return out


def launcher_values(info: SequenceInfo, plans, zeroing: tuple = ()) -> dict:
    """The template's values for the launcher of `info`, whose kernels have `plans`;
    `zeroing` (kgen/sequence_zeroing.py): a kernel whose buffers an earlier row kernel zeroes
    is launched by its `<name>_launch_zeroed` (no zeroing kernel of its own)."""
    zeroed = {z.adder: z.by for z in zeroing if z.folded}
    launches = [dict(kernel=kernel.name, members=_kernel_members(info, kernel, plan),
                     own_workspace=any(f.param is None and f.ctype == "ptr"
                                       for f in plan.fields),
                     entry="launch_zeroed" if kernel.name in zeroed else "launch",
                     zeroed_by=zeroed.get(kernel.name))
                for kernel, plan in zip(info.kernels, plans)]
    return dict(
        members=_members(info, plans),
        dims=list(info.dims),
        workspace=[dict(name=b.name, element=b.param.dtype.cpp,
                        bytes=_product((*b.param.full_shape, b.param.dtype.nbytes)))
                   for b in info.workspace],
        align=WORKSPACE_ALIGN,
        launches=launches,
    )
