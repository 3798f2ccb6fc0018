"""Using what `kgen tune` found: the tuned configuration of a kernel at given sizes on the
present GPU (`kgen run`), and a loaded kernel that follows the tune cache per call
(`kgen.load`).

`kgen.load` does not know the sizes until it is called. When the tune cache holds an entry for
the kernel, its arch and the present GPU (any size bucket), `load` returns a `TunedKernel`: each
call takes its sizes from the arguments' shapes, and the first call of each size bucket looks
the bucket up; with an entry, the call runs its configuration. Buckets without one run the
configuration the call's exact sizes call for (kgen/lower/builder.py's `sized`: on sm_90a,
another tile or split-K where the default 128x256 tiles leave SMs idle), or else the kernel
`load` built. Each configuration is planned, compiled and loaded once, on first use, and shared
by every call that comes to it. Without any entry, and for a kernel whose schedule the sizes
cannot change (lines written, reductions, or not sm_90a), `load` returns the plain
CompiledKernel, so such a kernel pays nothing.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Mapping

from .. import ir
from ..errors import KgenRuntimeError
from ..lower import builder
from ..lower.builder import WHY_TUNED
from ..plan import KernelPlan
from ..runtime.calls import CallPath
from ..runtime.outputs import infer_sizes
from ..targets import WHY_SIZED, Config, target
from . import cache



def lookup(kernel: ir.Kernel, arch: ir.Arch, gpu: str,
           sizes: Mapping[str, int]) -> cache.TuneEntry | None:
    """The tune cache's entry for `kernel` planned for `arch` on `gpu` at `sizes`."""
    return cache.lookup(cache.tune_key(kernel, arch, gpu, sizes))


def tuned(plan: KernelPlan) -> bool:
    """True if the plan took a tuned configuration (its filled lines say so)."""
    return any(c.why.startswith(WHY_TUNED) for c in plan.schedule.chosen)


def describe(plan: KernelPlan, entry: cache.TuneEntry | None) -> str:
    """One line: which schedule the plan runs, and whether `kgen tune`'s entry was used (a tile
    program: the loop rulebook's configuration; a row kernel has none)."""
    if getattr(plan, "kind", None) == "loop":
        return f"configuration: {plan.config.value} ({plan.config.why})"
    if getattr(plan, "kind", None) == "rows":
        return "a row kernel: one warp per row, no configuration to choose"
    if entry is not None and tuned(plan):
        sizes = ",".join(f"{n}={v}" for n, v in entry.sizes)
        return (f"schedule: tuned by kgen tune on {entry.date[:10]} ({entry.label}; "
                f"{entry.time_ms:.4g} ms at {sizes} on {entry.key.gpu})")
    if entry is not None:
        reason = next((why for label, why in plan.schedule.untaken
                       if label == entry.config.label),
                      "the lines the source writes take precedence")
        return (f"schedule: the kgen tune entry ({entry.label}) was not used: {reason}; "
                "kgen's builder chose")
    filled = ", ".join(f"{c.line} {c.value}" for c in plan.schedule.chosen)
    if filled:
        return f"schedule: kgen's builder filled {filled} (no kgen tune entry for these sizes)"
    return "schedule: as the source writes it"


def sizes_of(plan: KernelPlan, args: Mapping[str, Any],
             sizes: Mapping[str, int] | None) -> dict[str, int] | None:
    """Every runtime size of a call, from its arguments' shapes (None: some size unknown,
    which the argument check reports)."""
    shapes = {name: tuple(value.shape) for name, value in args.items()
              if value is not None and hasattr(value, "shape")}
    found = {**infer_sizes(plan, shapes), **dict(sizes or {})}
    dims = {d for p in plan.params if p.kind is not ir.ParamKind.SCALAR
            for d in p.shape if isinstance(d, str)}
    if not dims <= set(found):
        return None
    try:
        return {d: int(found[d]) for d in dims}
    except (TypeError, ValueError):
        return None


class TunedKernel:
    """A loaded kernel that runs, per call, the tuned variant of the call's size bucket (see
    the module's note); everything else is the default CompiledKernel's."""

    def __init__(self, kernel: ir.Kernel, arch: ir.Arch, gpu: str, default,
                 make: Callable[[Config], Any]):
        self.kernel_ir = kernel
        self.arch = arch
        self.gpu = gpu
        self.default = default
        self._make = make
        self._entries: dict[tuple, cache.TuneEntry | None] = {}  # per size bucket and rows
        self._variants: dict[str, Any] = {}  # per configuration ("tuned"/"sized" and label)
        # per exact sizes seen: what variant() chose, so that a repeated call only looks it up
        self._by_sizes: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        # Calls: checked once per argument signature, which also fixes the variant
        self._calls = CallPath(default.plan, self._for)

    @property
    def plan(self) -> KernelPlan:
        return self.default.plan

    def config(self, sizes: Mapping[str, int]) -> Config | None:
        """The configuration for these sizes: the tune entry of their bucket, else the one the
        exact sizes call for (builder.sized; None: the default)."""
        bucket = cache.size_key(self.kernel_ir, sizes)
        if bucket not in self._entries:
            self._entries[bucket] = lookup(self.kernel_ir, self.arch, self.gpu, sizes)
        entry = self._entries[bucket]
        if entry is not None:
            return entry.config
        return builder.sized(self.kernel_ir, target(self.arch), sizes)

    def variant(self, sizes: Mapping[str, int]):
        """The CompiledKernel that runs calls of these sizes (compiled on first use)."""
        key = tuple(sorted(sizes.items()))
        found = self._by_sizes.get(key)
        if found is not None:
            return found
        with self._lock:
            self._by_sizes[key] = chosen = self._choose(sizes)
            return chosen

    def _choose(self, sizes: Mapping[str, int]):
        """variant()'s choice for sizes not seen before (under the lock)."""
        config = self.config(sizes)
        if config is None:
            return self.default
        what = "sized" if config.why.startswith(WHY_SIZED) else "tuned"
        label = f"{what} {config.label}"  # the sized why names the sizes: not in the key
        found = self._variants.get(label)
        if found is not None:
            return found
        chosen = self.default
        try:
            chosen = self._make(config)
        except KgenRuntimeError as err:
            warnings.warn(f"the {what} variant of {self.plan.name} for "
                          f"{cache.sizes_text(self.kernel_ir, sizes)} failed to build "
                          f"({err}); running the default", RuntimeWarning, stacklevel=4)
        self._variants[label] = chosen
        return chosen

    def _for(self, args: Mapping[str, Any], sizes: Mapping[str, int] | None):
        found = sizes_of(self.plan, args, sizes)
        return self.default if found is None else self.variant(found)

    def __call__(self, stream: Any = None, sizes: Mapping[str, int] | None = None, **args):
        return self._calls(stream, sizes, args)

    def bind(self, sizes: Mapping[str, int] | None = None, **args):
        return self._for(args, sizes).bind(sizes, **args)

    def launch(self, bound, stream: int = 0) -> None:
        self.variant(bound.sizes).launch(bound, stream)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("default", "_make", "_entries", "_variants",
                                               "_by_sizes", "_lock", "_calls"):
            raise AttributeError(name)
        return getattr(self.default, name)

    def __repr__(self) -> str:
        return (f"TunedKernel({self.default!r}, {len(self._entries)} size buckets seen, "
                f"{len(self._variants)} variants built)")


def follow_cache(kernel: ir.Kernel, arch: ir.Arch, gpu: str, default,
                 make: Callable[[Config], Any]):
    """`default` (a CompiledKernel) itself when the tune cache has no entry for the kernel, its
    arch and `gpu` (the device's name) and the runtime sizes cannot change its schedule; else a
    TunedKernel around it."""
    if not cache.any_entries(kernel, arch, gpu) and not builder.sizable(kernel, target(arch)):
        return default
    return TunedKernel(kernel, arch, gpu, default, make)
