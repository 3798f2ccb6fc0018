"""The lowering's structure (kgen/lower/__init__.py): its passes (PASSES) run once each, in
order, and no pass writes a field of a plan value that an earlier pass wrote.

The recorder notes, for every value of a plan type (the dataclasses of kgen.plan, kgen.targets
and the passes' parts) made while a lowering runs, which pass wrote each field it was given; a
dataclasses.replace() of a field that another pass wrote (or, outside the passes, that any
pass wrote: the builder, the assembly) is a violation. A pass may replace what it made itself.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from pathlib import Path

import pytest

import kgen.lower
import kgen.lower.mainloops
import kgen.lower.select
import kgen.plan
import kgen.plan.epilogue
import kgen.plan.schedule
import kgen.targets
from kgen import ir
from kgen.api import build, build_file, read_module
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.verify import verify
from tests.kernels import b2b_chain_text, gemm_kernel

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.kg"))
# the plan's types, the targets' (candidates, drafts, placements) and the passes' parts
PLAN_MODULES = (kgen.plan, kgen.plan.schedule, kgen.plan.epilogue, kgen.targets, kgen.lower,
                kgen.lower.mainloops, kgen.lower.select)
NAMES = [p.name for p in kgen.lower.PASSES]


def plan_types() -> list[type]:
    return [cls for module in PLAN_MODULES for _, cls in inspect.getmembers(module, inspect.isclass)
            if dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__]


class Recorder:
    def __init__(self) -> None:
        self.current: str | None = None  # the pass running now
        self.writers: dict[int, tuple[object, dict[str, str | None]]] = {}
        self.violations: list[str] = []
        self.runs: list[list[str]] = []  # per lowering, the passes in the order they ran
        self.parts: list[dict[str, object]] = []  # per lowering, each pass's part

    def made(self, obj: object, given: set[str]) -> None:
        self.writers[id(obj)] = (obj, {f: self.current for f in given})

    def replaced(self, old: object, new: object, changes: dict) -> None:
        record = self.writers.get(id(old))
        if record is None or record[0] is not old:
            return
        for name in changes:
            writer = record[1].get(name)
            if writer is not None and writer != self.current:
                self.violations.append(
                    f"{self.current or 'code outside the passes'} rewrote "
                    f"{type(old).__name__}.{name}, which the {writer} pass wrote")
        fields = {f: w for f, w in record[1].items() if f not in changes}
        self.writers[id(new)] = (new, fields | {f: self.current for f in changes})


@contextlib.contextmanager
def recording(monkeypatch):
    rec = Recorder()
    for cls in plan_types():
        names = [f.name for f in dataclasses.fields(cls) if f.init]

        def init(self, *args, __init=cls.__init__, __names=names, **kwargs):
            __init(self, *args, **kwargs)
            rec.made(self, set(__names[:len(args)]) | set(kwargs))

        monkeypatch.setattr(cls, "__init__", init)
    original_replace = dataclasses.replace

    def replace(obj, /, **changes):
        new = original_replace(obj, **changes)
        rec.replaced(obj, new, changes)
        return new

    monkeypatch.setattr(dataclasses, "replace", replace)

    def wrap(p):
        def run(*args):
            outer, rec.current = rec.current, p.name
            rec.runs[-1].append(p.name)
            try:
                part = rec.parts[-1][p.name] = p.run(*args)
                return part
            finally:
                rec.current = outer
        return kgen.lower.Pass(p.name, run)

    monkeypatch.setattr(kgen.lower, "PASSES", tuple(wrap(p) for p in kgen.lower.PASSES))
    original_lower = kgen.lower._lower

    def lower(*args, **kwargs):
        rec.runs.append([])
        rec.parts.append({})
        return original_lower(*args, **kwargs)

    monkeypatch.setattr(kgen.lower, "_lower", lower)
    yield rec


def check(rec: Recorder) -> None:
    assert rec.runs, "no lowering ran"
    for order in rec.runs:  # a refused configuration stops after the pass that refused it
        assert order == NAMES[:len(order)], f"passes ran as {order}, not in the order {NAMES}"
    assert any(order == NAMES for order in rec.runs)
    for parts in rec.parts:  # the schedule takes one mainloop's plans, the very values
        if "schedule" in parts:
            gemms = parts["schedule"].candidate.gemms
            assert any(len(gemms) == len(plans) and all(a is b for a, b in zip(gemms, plans))
                       for plans in parts["mainloop"].plans.values()), (
                "the selected schedule's gemm plans are not one mainloop's, unchanged")
    assert not rec.violations, "\n".join(dict.fromkeys(rec.violations))


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_no_pass_rewrites_an_earlier_pass_in_any_example(path, monkeypatch):
    module, _ = read_module(path)
    if not module.kernels[0].gemms:
        pytest.skip("a storage-only example")
    own = module.kernels[0].target
    with recording(monkeypatch) as rec:
        for arch in [None] if own is ir.Arch.SM90A else [None, ir.Arch.SM90A]:
            try:
                build_file(_relative(path), arch)
            except KgenError:
                if arch is None:
                    raise
    check(rec)


@pytest.mark.parametrize("tile,warps", [((256, 160, 64), (2, 4)),  # only wgmma plans it
                                        ((128, 256, 64), (2, 4)), ((64, 64, 32), (2, 2))])
def test_no_pass_rewrites_an_earlier_pass_in_one_gemm(tile, warps, monkeypatch):
    with recording(monkeypatch) as rec:
        kgen.lower.lower(gemm_kernel(tile=tile, warps=warps, stages=3, arch=ir.Arch.SM90A))
    check(rec)


CHAINS = [  # (dtype, K0, N0, N1, target, schedule, g0 lines, g1 lines): lines left out are
    # the builder's (ping-pong chains with column passes, blocks and three consumers)
    ("f16", 256, 128, 256, "sm_90a", None, (), ()),
    ("f16", 256, 64, 640, "sm_90a", None, (), ()),
    ("bf16", 576, 64, 128, "sm_90a", None, (), ()),
    ("f16", 256, 64, 128, "sm_90a", "pingpong",
     ("tile 64x64x64 warps 4x1 stages 18", "keep B0 resident"),
     ("tile 64x128x64 warps 4x1 stages 3", "keep g0 in registers", "keep B1 resident")),
    ("f16", 256, 64, 128, "sm_80", None, (), ()),  # the persistent chain, resident
]


@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: "-".join(map(str, c[:6])))
def test_no_pass_rewrites_an_earlier_pass_in_a_chain(chain, monkeypatch):
    t, k0, n0, n1, arch, schedule, g0, g1 = chain
    text = b2b_chain_text(t, k0, n0, n1, target=arch, schedule=schedule, g0=g0, g1=g1)
    module = parse(text, "chain.kg")
    verify(module)
    with recording(monkeypatch) as rec:
        build(module.kernels[0], source_name="chain.kg")
    check(rec)


def test_the_recorder_sees_a_pass_that_rewrites_the_mainloop(monkeypatch):
    """A schedule pass that rewrote the mainloop's warps (as sm_90a's consumer plan did) is
    a violation: the test can fail."""
    def rewriting(kernel, tgt, options, parts):
        g = parts["mainloop"].written[0]
        dataclasses.replace(g, warps=(8, 1), warp_tile=(16, g.tile[1]))
        return schedule(kernel, tgt, options, parts)

    schedule = next(p.run for p in kgen.lower.PASSES if p.name == "schedule")
    monkeypatch.setattr(kgen.lower, "PASSES", tuple(
        kgen.lower.Pass(p.name, rewriting if p.name == "schedule" else p.run)
        for p in kgen.lower.PASSES))
    with recording(monkeypatch) as rec:
        kgen.lower.lower(gemm_kernel(tile=(128, 256, 64), warps=(2, 4), stages=3,
                                     arch=ir.Arch.SM90A))
    with pytest.raises(AssertionError, match="schedule rewrote GemmPlan.warps, which the "
                       "mainloop pass wrote"):
        check(rec)


def test_the_recorder_sees_passes_out_of_order(monkeypatch):
    monkeypatch.setattr(kgen.lower, "PASSES", tuple(reversed(kgen.lower.PASSES[:2]))
                        + kgen.lower.PASSES[2:])
    with recording(monkeypatch) as rec:
        with contextlib.suppress(Exception):
            kgen.lower.lower(gemm_kernel(tile=(128, 256, 64), warps=(2, 4), stages=3,
                                         arch=ir.Arch.SM90A))
    with pytest.raises(AssertionError, match="not in the order"):
        check(rec)


def test_the_targets_are_handed_no_callback_into_the_lowering():
    """A target's candidates yield their trial placements (targets.Placement) instead of
    calling the storage pass through the draft: the draft holds data only."""
    for f in dataclasses.fields(kgen.targets.ScheduleDraft):
        assert "Callable" not in str(f.type), f"ScheduleDraft.{f.name}: {f.type}"
