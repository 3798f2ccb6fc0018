"""On an H100/H200: FP8 GEMMs with block scales (examples/gemm_fp8_blockwise.kg: A's 1x128,
B's 128x128) against the float64 product of the dequantized operands (each element of A times
its row's scale of its k block, each of B times its 128x128 block's), at ragged sizes (K not a
multiple of 128: the last block's scale covers its partial k tile), through both entry points,
on the builder's schedule and on written ones, every output element written (poisoned first).
The bound is test_fp8_gpu.check's, over the dequantized operands."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from kgen import ir

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SIZES = [(1, 8, 16), (17, 24, 40), (127, 130, 33), (1000, 1000, 1000), (4097, 4104, 200),
         (256, 512, 4096), (130, 264, 8200)]


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def blockwise(name: str = "", *, layouts=None, scales=("A", "B"), schedule=None,
              cluster=None) -> ir.Kernel:
    """The example, with SA / SB in other layouts, one operand's scale only, or a written
    schedule (kind, tile, stages)."""
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / "gemm_fp8_blockwise.kg").kernels[0]
    g = kernel.gemms[0]
    g = dataclasses.replace(g, scales=tuple(s for s in g.scales if s.operand in scales))
    params = kernel.params
    if layouts is not None:
        params = tuple(dataclasses.replace(p, layout=layouts[p.name]) if p.name in layouts
                       else p for p in params)
    params = tuple(p for p in params if p.name not in ("SA", "SB")
                   or p.name[1] in scales)
    kind = None
    if schedule is not None:
        kind, tile, stages = schedule
        g = dataclasses.replace(g, tile=ir.TileShape(*tile), warps=ir.WarpGrid(2, 4),
                                stages=ir.StageCount(stages),
                                cluster=ir.ClusterShape(*cluster) if cluster else None)
    return dataclasses.replace(kernel, params=params, gemms=(g,), schedule=kind,
                               name=kernel.name + name)


def scale_tensor(torch, rows, cols, layout, g):
    """f32 scales in [0.25, 2) of one sign or the other, stored in `layout`."""
    value = (torch.rand(rows, cols, device="cuda", generator=g) * 1.75 + 0.25)
    value = value * (torch.randint(0, 2, (rows, cols), device="cuda", generator=g) * 2 - 1)
    return value.t().contiguous().t() if layout is ir.Layout.COL else value.contiguous()


def dequantized(torch, a, b, sa, sb):
    """A [M, K] and B [K, N] in float64 times their block scales (None: not scaled)."""
    m, k = a.shape
    n = b.shape[1]
    a64, b64 = a.double(), b.double()
    if sa is not None:
        a64 = a64 * sa.double().repeat_interleave(128, dim=1)[:, :k]
    if sb is not None:
        block = sb.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
        b64 = b64 * block[:n, :k].t()
    return a64, b64


def overlapped(kernel: ir.Kernel, turns: bool, early_release: bool):
    """The kernel built on its plan with the promotion overlap set (the plan option
    promotion.with_promotion_overlap), compiled for this GPU."""
    from kgen.api import build, load_built
    from kgen.emit import emit
    from kgen.targets.sm90.promotion import with_promotion_overlap

    built = build(kernel)
    plan = with_promotion_overlap(built.plan, turns, early_release)
    source = emit(plan, source_name="overlap.kg", source_hash="0", command="test")
    return load_built(dataclasses.replace(built, plan=plan, source=source))


def run(kernel: ir.Kernel, mnk, seed=0, pad=0, compiled=None):
    """`pad`: the operands' rows `pad` bytes longer than K (the narrow entry point where the
    pitch is off 16 bytes); `compiled`: the kernel already loaded (a plan option's)."""
    torch = pytest.importorskip("torch")
    import kgen

    from tests.gpu.test_fp8_gpu import check

    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k + pad, device="cuda", generator=g) / math.sqrt(max(k, 1)))
    a = a.to(torch.float8_e4m3fn)[:, :k]
    b = torch.randn(n, k + pad, device="cuda", generator=g).to(torch.float8_e4m3fn)[:, :k].t()
    args = dict(A=a, B=b)
    kb = -(-k // 128)
    if kernel.param("SA") is not None:
        args["SA"] = scale_tensor(torch, m, kb, kernel.param("SA").layout, g)
    if kernel.param("SB") is not None:
        args["SB"] = scale_tensor(torch, -(-n // 128), kb, kernel.param("SB").layout, g)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    compiled = compiled if compiled is not None else kgen.load(kernel)
    compiled(**args, D=d)
    torch.cuda.synchronize()
    assert not torch.isnan(d).any(), "output elements left unwritten"
    a64, b64 = dequantized(torch, a, b, args.get("SA"), args.get("SB"))
    check(d, a64, b64, torch.tensor(1.0, device="cuda", dtype=torch.float64))
    return compiled


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_blockwise_example_at_ragged_sizes(mnk):
    built = run(blockwise(), mnk)
    assert built.plan.schedule.gemms[0].promotion.k_tiles == 1
    assert built.plan.gemms[0].tile[1] == 192  # spans two of B's scale blocks


@pytest.mark.parametrize("mnk", [(17, 24, 40), (1000, 1000, 1000), (130, 264, 8200)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", ["sa_row_sb_col", "a_only", "b_only", "pingpong64",
                                     "tile_n64", "cooperative128", "cluster2x1"])
def test_blockwise_variants(variant, mnk):
    kernel = {
        "sa_row_sb_col": lambda: blockwise("_rc", layouts={"SA": ir.Layout.ROW,
                                                          "SB": ir.Layout.COL}),
        "a_only": lambda: blockwise("_a", scales=("A",)),
        "b_only": lambda: blockwise("_b", scales=("B",)),
        "pingpong64": lambda: blockwise("_pp", schedule=(ir.Schedule.PINGPONG, (64, 128, 128),
                                                         6)),
        "tile_n64": lambda: blockwise("_n64", schedule=(None, (128, 64, 128), 8)),
        "cooperative128": lambda: blockwise("_c128", schedule=(None, (128, 128, 128), 6)),
        "cluster2x1": lambda: blockwise("_c2", schedule=(None, (128, 192, 128), 4),
                                        cluster=(2, 1)),
    }[variant]()
    run(kernel, mnk)


@pytest.mark.parametrize("mnk", [(127, 136, 48), (4097, 4104, 208), (130, 264, 8320)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("turns, early", [(True, False), (False, True), (True, True)],
                         ids=["turns", "early-release", "both"])
@pytest.mark.parametrize("schedule", [None, (None, (128, 128, 128), 6)],
                         ids=["builder", "128x128"])
def test_blockwise_promotion_overlap(schedule, turns, early, mnk):
    """The consumers taking turns at their k tiles' groups (named barriers; the walk's last
    pass absorbed) and each slot released at its group's wait: the same product through the
    fast entry point (sizes of 16-byte rows: one k tile, many tiles per CTA, K past 8192) and
    the narrow one (odd N, operand rows one byte longer)."""
    kernel = blockwise("_ov", schedule=schedule) if schedule else blockwise()
    compiled = overlapped(kernel, turns, early)
    promotion = compiled.plan.schedule.gemms[0].promotion
    assert (promotion.turns, promotion.early_release) == (turns, early)
    run(kernel, mnk, compiled=compiled)
    run(kernel, (mnk[0], mnk[1] + 1, mnk[2]), pad=1, compiled=compiled)  # the narrow entry point


def halved(kernel: ir.Kernel):
    """The kernel built on its plan with period sets HALVES (the plan option
    promotion.with_period_sets), compiled for this GPU."""
    from kgen.api import build, load_built
    from kgen.emit import emit
    from kgen.plan import PeriodSets
    from kgen.targets.sm90.promotion import with_period_sets

    built = build(kernel)
    plan = with_period_sets(built.plan, PeriodSets.HALVES)
    source = emit(plan, source_name="halves.kg", source_hash="0", command="test")
    return load_built(dataclasses.replace(built, plan=plan, source=source))


@pytest.mark.parametrize("mnk", [(1, 8, 16), (127, 136, 48), (1000, 1000, 1000),
                                 (4097, 4104, 208), (130, 264, 8320), (256, 512, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("schedule", [None, (None, (128, 128, 128), 6),
                                      (None, (128, 160, 128), 4), (None, (128, 144, 128), 5),
                                      (ir.Schedule.PINGPONG, (64, 128, 128), 8)],
                         ids=["builder", "128x128", "128x160", "128x144", "pingpong64x128"])
def test_blockwise_period_halves(schedule, mnk):
    """Each k tile in two groups of half the tile's columns, two k tiles a pass, each group
    promoted while the next multiplies: one k tile (an odd count), two, many, K past 8192; the
    fast entry point and the narrow one (odd N, operand rows one byte longer)."""
    kernel = blockwise("_h", schedule=schedule) if schedule else blockwise()
    compiled = halved(kernel)
    assert compiled.plan.schedule.gemms[0].promotion.sets.value == "halves"
    run(kernel, mnk, compiled=compiled)
    run(kernel, (mnk[0], mnk[1] + 1, mnk[2]), pad=1, compiled=compiled)


def producer_loaded(kernel: ir.Kernel, sets):
    """The kernel built on its plan with the producer warp's scale copies into each slot's
    buffer (the plan option promotion.with_scale_loads) and period sets `sets`, compiled for
    this GPU."""
    from kgen.api import build, load_built
    from kgen.emit import emit
    from kgen.plan import ScaleLoads
    from kgen.targets.sm90.promotion import with_period_sets, with_scale_loads

    built = build(kernel)
    plan = with_scale_loads(with_period_sets(built.plan, sets), ScaleLoads.PRODUCER)
    source = emit(plan, source_name="loads.kg", source_hash="0", command="test")
    return load_built(dataclasses.replace(built, plan=plan, source=source))


@pytest.mark.parametrize("mnk", [(1, 8, 16), (127, 136, 48), (1000, 1000, 1000),
                                 (4097, 4104, 208), (130, 264, 8320)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("schedule, sets", [(None, "halves"), (None, "one"),
                                           ((None, (128, 128, 128), 5), "halves")],
                         ids=["builder-halves", "builder-one", "128x128-halves"])
def test_blockwise_producer_scale_loads(schedule, sets, mnk):
    """The producer warp's scale copies into each slot's buffer (the plan option beside the
    rulebook's consumer loads): the fast entry point and the narrow one (odd N, operand rows
    one byte longer), tiles past M and N."""
    from kgen.plan import PeriodSets, ScaleLoads

    kernel = blockwise("_p", schedule=schedule) if schedule else blockwise()
    compiled = producer_loaded(kernel, PeriodSets(sets))
    assert compiled.plan.schedule.gemms[0].promotion.scale_loads is ScaleLoads.PRODUCER
    run(kernel, mnk, compiled=compiled)
    run(kernel, (mnk[0], mnk[1] + 1, mnk[2]), pad=1, compiled=compiled)


@pytest.mark.parametrize("schedule", [(None, (128, 160, 128), 4), (None, (128, 144, 128), 5)],
                         ids=["128x160", "128x144"])
def test_blockwise_tiles_over_two_scale_blocks(schedule):
    """Tile N 144 and 160 (DeepGEMM's widths): tiles start 16 or 32 columns apart in B's scale
    blocks and span two."""
    kernel = blockwise("_w", schedule=schedule)
    for mnk in [(127, 136, 48), (1000, 1000, 1000), (300, 1288, 520)]:
        run(kernel, mnk)


def test_blockwise_period_halves_on_a_cluster():
    kernel = blockwise("_hc", schedule=(None, (128, 192, 128), 4), cluster=(2, 1))
    compiled = halved(kernel)
    run(kernel, (4097, 4104, 208), compiled=compiled)
    run(kernel, (1000, 1000, 1000), compiled=compiled)


def test_blockwise_promotion_overlap_on_a_cluster():
    """Turns and the early release with the multicast ring of a 2x1 cluster (each slot freed in
    both CTAs at its wait)."""
    kernel = blockwise("_ovc", schedule=(None, (128, 192, 128), 4), cluster=(2, 1))
    compiled = overlapped(kernel, True, True)
    run(kernel, (4097, 4104, 208), compiled=compiled)
    run(kernel, (1000, 1000, 1000), compiled=compiled)


@pytest.mark.parametrize("mnk, pad", [((130, 264, 33), 1), ((130, 264, 1001), 3),
                                      ((64, 96, 4095), 1)],
                         ids=["odd-k", "odd-k-odd-rows", "long-odd-k"])
def test_blockwise_narrow_entry_point(mnk, pad):
    run(blockwise(), mnk, pad=pad)


def test_blockwise_scales_matter_per_block():
    """One k block's scale of one row changed changes that row only, by that block's share."""
    torch = pytest.importorskip("torch")
    import kgen

    m, n, k = 256, 256, 512
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa = torch.ones(k // 128, m, device="cuda").t()
    sb = torch.ones(n // 128, k // 128, device="cuda")
    compiled = kgen.load(EXAMPLES / "gemm_fp8_blockwise.kg")
    base = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    compiled(A=a, B=b, SA=sa, SB=sb, D=base)
    sa[77, 2] = 0.0  # row 77 loses k block 2 (k 256..383)
    changed = torch.empty_like(base)
    compiled(A=a, B=b, SA=sa, SB=sb, D=changed)
    torch.cuda.synchronize()
    rows = (changed != base).any(dim=1).nonzero().flatten().tolist()
    assert rows == [77]
    want = a[77:78, :256].double() @ b[:256].double() + a[77:78, 384:].double() @ b[384:].double()
    torch.testing.assert_close(changed[77:78].double(), want, atol=2e-2, rtol=1e-2)


def test_blockwise_against_torch_scaled_mm_blockwise_where_torch_has_it():
    """torch._scaled_mm's block-wise mode (1x128 by 128x128), where this torch build has it."""
    torch = pytest.importorskip("torch")
    import kgen

    m, n, k = 512, 768, 1024
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa = (torch.rand(k // 128, m, device="cuda") + 0.5).t()  # [M, K / 128], M contiguous
    sb = torch.rand(n // 128, k // 128, device="cuda") + 0.5
    want, why = torch_blockwise(torch, a, b, sa, sb)
    if want is None:
        pytest.skip(f"torch has no block-wise scaled_mm here: {why}")
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    kgen.load(EXAMPLES / "gemm_fp8_blockwise.kg")(A=a, B=b, SA=sa, SB=sb, D=d)
    torch.cuda.synchronize()
    torch.testing.assert_close(d.float(), want.float(), atol=2e-2, rtol=2e-2)


def torch_blockwise(torch, a, b, sa, sb):
    """torch's block-wise FP8 product (A 1x128 by B 128x128, bf16 out) and "", or None and why
    not: torch.nn.functional.scaled_mm with its ScalingType where torch has it, else
    torch._scaled_mm with the scales' shapes. sa: [M, K / 128] (M contiguous); sb: [N / 128,
    K / 128]."""
    import torch.nn.functional as F

    whys = []
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        try:
            return F.scaled_mm(a, b, sa, F.ScalingType.BlockWise1x128, sb.t(),
                               F.ScalingType.BlockWise128x128,
                               output_dtype=torch.bfloat16), ""
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
            whys.append(f"F.scaled_mm: {str(error).splitlines()[0]}")
    try:
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16), ""
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
        whys.append(f"torch._scaled_mm: {str(error).splitlines()[0]}")
    return None, "; ".join(whys)


def test_blockwise_refuses_a_wrong_scale_shape():
    torch = pytest.importorskip("torch")
    import kgen
    from kgen.errors import ArgumentError

    m, n, k = 64, 128, 384
    a = torch.zeros(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.zeros(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    compiled = kgen.load(EXAMPLES / "gemm_fp8_blockwise.kg")
    with pytest.raises(ArgumentError, match=r"KS = 2 but K = 384.*ceil\(K / 128\) = 3"):
        compiled(A=a, B=b, SA=torch.ones(2, m, device="cuda").t(),
                 SB=torch.ones(1, 2, device="cuda"), D=d)
