"""sm_90a's ping-pong chain with a ring shorter than the first gemm's k tiles (the consumers take
turns at its mainloop: Schedule.consumer_order, as every ping-pong chain does) and with the
first gemm's B streamed through the ring beside A (Schedule.chain_ring_b): the plan, the
storage, the emitted producer and consumer, the refusals, the builder's list, and NVRTC with
no spill."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.api import build
from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import LoadPath
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, b2b_chain_text, from_template

TEXT = """\
kernel pp {
  target sm_90a
  schedule pingpong
  tensor A : DT[M, K0] row
  tensor B0 : DT[K0, N0] B0LAYOUT
  tensor B1 : DT[N0, N1] col
  tensor D1 : DT[M, N1] row out
  vector bias0 : f32[N0]
  gemm g0 = A @ B0 {
    tile 64xN0x64 warps 4x1 stages STAGES
    RESIDENT0
    epilogue { g0 = relu(acc + bias0[col]) }
  }
  gemm g1 = g0 @ B1 {
    tile 64xN1x64 warps 4x1 stages 2
    keep registers
    keep B1 resident
    epilogue { D1 = relu(acc) }
  }
}
"""
DEFAULTS = dict(DT="f16", K0="576", N0="128", N1="128", B0LAYOUT="col", STAGES="6",
                RESIDENT0="")


def kernel(**changes) -> ir.Kernel:
    return from_template(TEXT, DEFAULTS, **changes)


def section(source: str, start: str, end: str) -> str:
    at = source.index(start)
    return source[at:source.index(end, at)]


def test_b0_streams_through_the_ring_beside_a():
    plan = lower(kernel())
    s = plan.schedule
    assert s.scheduler.pingpong and s.chain_ring_b and s.consumer_order and s.resident
    assert s.gemms[0].pipeline.a.load is LoadPath.TMA and s.gemms[0].pipeline.b.load is LoadPath.TMA
    assert s.gemms[1].pipeline.b.load is LoadPath.RESIDENT
    bufs = {b.name: b for b in plan.storage.buffers}
    # B0's ring: 6 k tiles of 128 rows x 64 (not all 9 of them), live through the kernel
    assert bufs["g0_b_smem"].bytes == 6 * 128 * 64 * 2
    assert "beside A's" in bufs["g0_b_smem"].role and bufs["g0_b_smem"].offset % 1024 == 0
    assert bufs["g0_b_smem"].live == (0, len(plan.storage.phases) - 1)
    assert bufs["g1_b_smem"].bytes == 128 * 128 * 2  # B1 stays resident
    # a full and an empty mbarrier per slot, then a turn barrier per consumer warpgroup
    assert bufs["g0_ring_barriers"].bytes == (2 * 6 + 2) * 8
    b0 = next(m for m in s.tensor_maps if m.param == "B0")
    assert (b0.rows, b0.cols, b0.box, b0.store) == (128, 576, (64, 128), False)
    rows = {label: value for label, value, _ in s.describe()}
    assert rows["g0 B"] == "TMA ring, K-major" and rows["consumer order"]


def test_the_streamed_ring_in_the_emitted_source():
    src = build(kernel(), source_name="t.kg").source
    producer = section(src, "void produce_ring(", "\n}\n")
    assert ("mbarrier_expect_tx(full_bar + 8 * slot, kAStageBytes + kBStageBytes);\n"
            "      tma_load_box(a_smem + slot * kAStageBytes, &maps.A, full_bar + 8 * slot, "
            "kt * kTileK, m0);\n"
            "      tma_load_box(b_smem + slot * kBStageBytes, &maps.B0, full_bar + 8 * slot, "
            "kt * kTileK, 0);") in producer
    body = src[src.index('extern "C" __global__'):src.index("// Host launcher")]
    # only B1 is loaded once per CTA; the consumer reads B0's k tile in the slot it waited on
    assert "Resident: all of B1, loaded once" in body and "smem.g0_b_smem()), p.B0" not in body
    assert "const unsigned b_stage = b_smem + slot * kBStageBytes;" in body
    order = ["const unsigned order_bar = empty_bar + 8 * g0_cfg::kStages;",
             "for (int w = 0; w < 2; ++w) mbarrier_init(order_bar + 8 * w, kWarpgroupThreads);",
             "if (local > 0) mbarrier_wait(order_bar + 8 * warpgroup, ((local - 1) / 2) & 1);",
             "int fill = local * k_tiles;",
             "mbarrier_arrive(empty_bar + 8 * slot);",
             "mbarrier_arrive(order_bar + 8 * (1 - warpgroup));",
             "g1_epilogue("]
    at = 0
    for item in order:
        at = body.index(item, at) + len(item)
    host = src[src.index("// Host launcher"):]
    assert "reinterpret_cast<CUtensorMap*>(&maps.B0)" in host


def test_a_resident_ring_shorter_than_the_k_tiles_takes_turns():
    plan = lower(kernel(N0="64", N1="128", STAGES="6", RESIDENT0="keep B0 resident"))
    s = plan.schedule
    assert s.consumer_order
    assert not s.chain_ring_b
    assert s.gemms[0].pipeline.b.load is LoadPath.RESIDENT
    src = build(kernel(N0="64", N1="128", STAGES="6", RESIDENT0="keep B0 resident"),
                source_name="t.kg").source
    assert "mbarrier_wait(order_bar + 8 * warpgroup" in src
    assert "const unsigned b_stage = b_smem + kt * kBStageBytes;" in src


def test_a_ring_longer_than_the_k_tiles_takes_turns_too():
    """The example's ring (12 slots for 9 k tiles) takes turns as well: without them a
    consumer's wait rested on the timing of the other's fills (a ring of k tiles + 1 crashed
    on an H200)."""
    changes = dict(N0="64", N1="128", STAGES="12", RESIDENT0="keep B0 resident")
    plan = lower(kernel(**changes))
    assert plan.schedule.consumer_order
    bars = next(b for b in plan.storage.buffers if b.name == "g0_ring_barriers")
    assert bars.bytes == (2 * 12 + 2) * 8 and "for their turns" in bars.role


@pytest.mark.parametrize("changes, message", [
    (dict(B0LAYOUT="row"), "streams B0 through the ring beside A (it is not kept resident), "
     "but B0 must be K-major"),
    (dict(STAGES="16"), "shared memory over budget"),
])
def test_streamed_b0_refusals_are_located(changes, message):
    with pytest.raises(KgenError) as info:
        lower(kernel(**changes))
    assert info.value.loc.line in (9, 10) and message in info.value.message, info.value.render()


def chain(k0: int, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("k0, n0, n1, slots", [
    # B0 (147 KB) and B1 (64 KB) leave no room for a ring of A; g1 in column passes, whose
    # staging fits beside 5 slots (tests/targets/test_sm90_column_passes.py)
    (576, 128, 256, 5),
    (1024, 128, 128, 6),  # B0 does not fit resident at all
    (576, 64, 64, 6),  # it would, but streamed B0 leaves room for the output staging
])
def test_the_builder_streams_b0_through_the_ring(k0, n0, n1, slots):
    plan = build(chain(k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.schedule.scheduler.pingpong and plan.schedule.chain_ring_b
    assert plan.gemms[0].stages == slots


def test_the_builder_keeps_a_row_major_b0_resident():
    """The copy engine streams only a K-major B0: a row-major one stays resident."""
    text = B2B_CHAIN.format(t="f16", k0=576, n0=64, n1=128).replace(
        "tensor B0 : f16[576, 64] col", "tensor B0 : f16[576, 64] row")
    module = parse(text, "chain.kg")
    verify(module)
    plan = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg").plan
    assert not plan.schedule.chain_ring_b
    assert any("must be K-major" in reason for _, reason in plan.schedule.untaken)


def test_a_chained_k_tile_divides_the_source_n():
    """N0 = 96: g1's tile K is 32 (64 does not divide 96), so the chain plans."""
    plan = build(chain(768, 96, 128), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.gemms[1].tile[2] == 32 and plan.schedule.scheduler.pingpong


@pytest.mark.parametrize("k0, n0, n1, dtype, resident", [
    (576, 128, 256, "f16", False), (1024, 128, 128, "bf16", False),
    (576, 128, 128, "f16", True),
])
def test_short_rings_compile_without_spills(k0, n0, n1, dtype, resident):
    from kgen.runtime.nvrtc import compile_cubin

    text = b2b_chain_text(
        dtype, k0, n0, n1, schedule="pingpong",
        g0=(f"tile 64x{n0}x64 warps 4x1 stages 6",) + (("keep B0 resident",) if resident else ()),
        g1=(f"tile 64x{n1}x64 warps 4x1 stages 2", "keep B1 resident"))
    module = parse(text, "chain.kg")
    verify(module)
    result = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.consumer_order
    assert result.plan.schedule.chain_ring_b is not resident
    resources = compile_cubin(result.source, result.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0


@pytest.mark.parametrize("k0, n0", [(1000, 128), (256, 64)])
def test_the_ring_maps_pull_128_byte_lines(k0, n0):
    """A's and B0's tensor maps pull 128-byte lines on an L2 miss (schedules.RING_PROMOTION:
    rows of 2000 bytes at K0 = 1000 ran 5-11% faster than on 256-byte lines); the output's map
    pulls none."""
    result = build(chain(k0, n0, 64), ir.Arch.SM90A, source_name="chain.kg")
    promotion = {m.param: m.l2_promotion for m in result.plan.schedule.tensor_maps}
    assert promotion == {"A": "L2_128B", "B0": "L2_128B", "D1": "NONE"}
    assert result.source.count("CU_TENSOR_MAP_L2_PROMOTION_L2_128B") == 2


@pytest.mark.parametrize("k0, n0, n1", [(1000, 64, 64), (1000, 32, 128), (200, 64, 64)])
def test_b0_resident_where_its_rows_split_sectors(k0, n0, n1):
    """K0 = 8 (mod 16): B0's rows are 16-byte but not 32-byte multiples; every tile's rereads
    of a streamed B0 from L2 ran 1.7x a copy's time at K0 = 1000, resident 1.15x
    (configs.split_rows). A multiple of 16 keeps B0 streamed."""
    from kgen.targets.sm90 import configs

    result = build(chain(k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
    schedule = result.plan.schedule
    assert schedule.scheduler.kind.value == "pingpong" and not schedule.chain_ring_b
    assert schedule.gemms[0].pipeline.b.load is LoadPath.RESIDENT
    rows = {label: why for label, _, why in schedule.describe()}
    assert "rows split 32-byte sectors" in rows["line schedule"]
    aligned = build(chain(k0 + 8, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
    assert aligned.plan.schedule.chain_ring_b
    shapes = [g for g in result.plan.gemms]
    assert configs.split_rows(configs.GemmShape("g0", "M", n0, k0, shapes[0].a.dtype,
                                                (True, True)))


def test_streamed_where_b0_does_not_fit_resident():
    """K0 = 1000 with N0 = 128: B0 (250 KB) does not fit resident; it streams."""
    result = build(chain(1000, 128, 128), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.scheduler.kind.value == "pingpong"
    assert result.plan.schedule.chain_ring_b


def test_split_rows_keep_the_output_staged_where_registers_would_not_serve():
    """K0 = 200 with N0 = 128, N1 = 256: stored from registers (224 values a thread) ran 1.75x
    the copy at K0 = 256, so only the resident rings whose staging fits come first
    (configs.resident_first): B0 resident on 8 slots, the output staged in column passes."""
    result = build(chain(200, 128, 256), ir.Arch.SM90A, source_name="chain.kg")
    schedule = result.plan.schedule
    assert not schedule.chain_ring_b and schedule.tma_output is not None
    assert result.plan.gemms[0].stages == 8 and schedule.gemms[-1].passes.count == 2


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 160, 256, "f16"), (1000, 64, 256, "bf16"),
                                               (200, 128, 256, "bf16"), (1000, 32, 128, "f16")])
def test_the_builders_new_choices_compile_without_spills(k0, n0, n1, dtype):
    """N0 = 160 with N1 = 256 on the ping-pong chain, and B0 resident for rows that split
    sectors, with and without the output staged: NVRTC allocates them with no local memory and
    no serialized wgmma."""
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.scheduler.kind.value == "pingpong"
    compiled = compile_cubin(result.source, result.plan.name, "sm_90a")
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0
    assert "serialized" not in compiled.log
