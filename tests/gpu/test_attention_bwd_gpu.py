"""On a GPU: the attention backward's main kernel (examples/attention_bwd.kg, the DAG loop's
mma.sync skeleton) against float64 torch autograd of a reference attention: dQ, dK and dV from
random inputs, with lse and D computed in float64 from the same inputs; every output poisoned
(NaN) first (dQ, an `out accumulate` tensor, is zeroed by the call itself). Ragged S and T from
{1, 17, 1000, 4097}, S != T, no mask and causal aligned top-left and bottom-right (rows that
see no key included), head dims 64 and 128, bf16 and f16, and the sm_90a target's build (the
mma.sync skeleton, with a written tile 128x32) and the sm_90a wgmma skeleton the rulebook picks
without one (templates/sm90/loop_bwd.cu.j2) on a Hopper GPU."""
from __future__ import annotations

import math

import pytest

from tests.gpu.attention_bwd_checks import MASKS, check_backward, load
from tests.gpu.attention_checks import cuda_torch, skip_unless_runs

pytestmark = pytest.mark.gpu


def run_case(d, s, t, mask, dtype="bf16", arch="sm_80", b=2, h=3, tile=None, adds=None,
             schedule=()):
    torch = cuda_torch()
    kernel = load(d, mask, dtype, arch, tile, adds, schedule)
    tdtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(1000 * s + t + d)
    q = torch.randn(b, h, s, d, device="cuda", generator=gen).to(tdtype)
    k = torch.randn(b, h, t, d, device="cuda", generator=gen).to(tdtype)
    v = torch.randn(b, h, t, d, device="cuda", generator=gen).to(tdtype)
    do = torch.randn(b, h, s, d, device="cuda", generator=gen).to(tdtype)
    return check_backward(kernel, q, k, v, do, mask)[0]


SHAPES = [(1, 1), (17, 17), (1, 17), (17, 1000), (1000, 17), (1000, 1000), (4097, 1000),
          (1000, 4097), (4097, 4097)]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_backward_matches_float64_autograd(d, mask, shape):
    run_case(d, *shape, mask)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["none", "bottom_right"])
def test_f16(d, mask):
    run_case(d, 1000, 4097, mask, dtype="f16")
    run_case(d, 17, 1000, mask, dtype="f16")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_sm90a_wgmma_skeleton_matches_float64_autograd(d, mask, shape):
    """The sm_90a build runs the rulebook's wgmma skeleton (templates/sm90/loop_bwd.cu.j2)."""
    skip_unless_runs("sm_90a")
    assert load(d, mask, arch="sm_90a").plan.wgmma is not None
    run_case(d, *shape, mask, arch="sm_90a")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["none", "bottom_right"])
def test_sm90a_wgmma_f16(d, mask):
    skip_unless_runs("sm_90a")
    run_case(d, 1000, 4097, mask, dtype="f16", arch="sm_90a")
    run_case(d, 17, 1000, mask, dtype="f16", arch="sm_90a")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", [(1, 1), (17, 1000), (1000, 17), (4097, 1000), (1000, 4097)],
                         ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("adds", ["tensor", "rows", "atomics"])
def test_sm90a_wgmma_with_other_adds(d, mask, shape, adds):
    """The plan options: dQ added by the copy engine's tensor reduce-add from a thread of each
    warpgroup, by its bulk reduce-add per staged row (cp.reduce.async.bulk) or by f32 atomics
    (loop_dag_schedule.with_adds) instead of the rulebook's tensor reduce-add from the
    producer's add warp."""
    from kgen.targets.sm90.loop_dag_schedule import add_mode

    skip_unless_runs("sm_90a")
    assert add_mode(load(d, mask, arch="sm_90a", adds=adds).plan.wgmma) == adds
    run_case(d, *shape, mask, arch="sm_90a", adds=adds)


def test_sm90a_wgmma_other_batches_and_heads():
    """B 1, H 1 (the tensor maps' head and batch extents 1) and B 3, H 5."""
    skip_unless_runs("sm_90a")
    run_case(128, 1000, 333, "top_left", arch="sm_90a", b=1, h=1)
    run_case(64, 333, 1000, "bottom_right", arch="sm_90a", b=3, h=5)


@pytest.mark.parametrize("d", [64, 128])
def test_sm90a_written_tile_runs_the_mma_sync_skeleton(d):
    """A written tile the wgmma skeleton does not take (128x32) keeps sm_90a on mma.sync."""
    skip_unless_runs("sm_90a")
    assert load(d, "top_left", arch="sm_90a", tile="128x32").plan.wgmma is None
    run_case(d, 1000, 4097, "top_left", arch="sm_90a", tile="128x32")
    run_case(d, 4097, 1000, "none", arch="sm_90a", tile="128x32")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_dq_is_zeroed_by_each_call(arch):
    """dQ is an `out accumulate` tensor: a second call into the same dQ gives the same values,
    not twice them."""
    torch = cuda_torch()
    skip_unless_runs(arch)
    first, _, _ = run_case(64, 1000, 1000, "top_left", b=1, h=2, arch=arch)
    kernel = load(64, "top_left", arch=arch)
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, 1000, 64, device="cuda", generator=gen).bfloat16()
                   for _ in range(4))
    args = dict(Q=q, K=k, V=v, dO=do, lse=torch.full((1, 2, 1000), 5.0, device="cuda"),
                D=torch.zeros(1, 2, 1000, device="cuda"), scale=0.125)
    dq = torch.full((1, 2, 1000, 64), math.nan, device="cuda")
    kernel(dQ=dq, **args)
    once = dq.clone()
    kernel(dQ=dq, **args)
    torch.cuda.synchronize()
    assert once.abs().max().item() > 0 and not torch.isnan(once).any()
    assert (dq - once).abs().max().item() <= 1e-4 * once.abs().max().item()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_no_key_rows_give_zero_dk_dv_and_all_masked_query_blocks_are_skipped(arch):
    """S < T under top-left causal: keys past the last query see no query; their dK and dV
    are zero (their CTAs skip every block and store the zero accumulators)."""
    torch = cuda_torch()
    skip_unless_runs(arch)
    _, dk, dv = run_case(128, 17, 1000, "top_left", b=1, h=1, arch=arch)
    assert torch.equal(dk[..., 17:, :].float(), torch.zeros_like(dk[..., 17:, :].float()))
    assert torch.equal(dv[..., 17:, :].float(), torch.zeros_like(dv[..., 17:, :].float()))


# The wgmma skeleton's schedules (loop_dag_schedule.with_schedule's plan options), each on and
# off beside the rulebook's choice, all off, all on
OPTIONS = ("issue_ahead", "stage_vectors", "defer_accumulating", "lpt", "fast_body")
SCHEDULES = {
    **{f"no_{o}": ((o, False),) for o in OPTIONS},
    "none": tuple((o, False) for o in OPTIONS),
    "all": tuple((o, True) for o in OPTIONS),
    "all_no_wait": tuple((o, True) for o in OPTIONS) + (("wait_accumulating", False),),
    "all_wait": tuple((o, True) for o in OPTIONS) + (("wait_accumulating", True),),
}


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", [(1, 1), (17, 1000), (1000, 17), (4097, 1000), (1000, 4097)],
                         ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_sm90a_wgmma_schedules(d, mask, shape, name):
    """Every schedule of the wgmma skeleton computes the same gradients (ragged S and T)."""
    skip_unless_runs("sm_90a")
    run_case(d, shape[0], shape[1], mask, arch="sm_90a", schedule=SCHEDULES[name])
