"""The Schedule's components (kgen/plan/schedule.py), each on its own: what it derives from its
values and the rows it gives `kgen inspect`; and Schedule.describe as the walk over them, in
the order the components are declared."""
from __future__ import annotations

from kgen.plan import (Cluster, ColumnPasses, EntryPoints, EpilogueGroups, EpilogueVectors,
                       GemmSchedule, KernelKind, KSplit, LoadPath, LineChoice, Mma, MmaAtom,
                       OperandSchedule, Output, Overlap, Pipeline, Raster, Schedule, StagedInput,
                       Staging, StagingMode, StorePath, TileScheduler, VectorHome, WarpRole,
                       WarpRoles)


def _labels(rows):
    return [label for label, _, _ in rows]


def test_the_tile_scheduler_derives_its_walk():
    tiled = TileScheduler(KernelKind.TILED, Raster(8))
    assert not tiled.persistent and not tiled.pingpong and tiled.k_split is KSplit.WHOLE
    split = TileScheduler(KernelKind.COOPERATIVE, Raster(8), split_k=4)
    assert split.persistent and split.k_split is KSplit.SPLIT
    stream = TileScheduler(KernelKind.COOPERATIVE, Raster(8), stream_k=True)
    assert stream.k_split is KSplit.STREAM
    assert TileScheduler(KernelKind.PINGPONG, Raster(8)).pingpong
    # split-K's row says what a part is: a unit of the persistent walk, or a CTA
    rows = {label: value for label, value, _ in split.describe()}
    assert "units of the persistent walk" in rows["split-K"]


def test_a_cluster_describes_itself_only_when_it_has_something_to_say():
    assert Cluster().size == 1 and Cluster().describe() == []
    assert Cluster((2, 1), "why").describe() == [("cluster", "2x1", "why")]
    assert Cluster((1, 1), "refused: why").describe() == [("cluster", "1x1", "refused: why")]


def test_warp_roles_count_their_threads_and_budgets():
    roles = WarpRoles((WarpRole("producer", 4, registers=40),
                       WarpRole("consumer", 4, groups=2, registers=232)))
    assert roles.threads == 384 and roles.role("consumer").groups == 2
    assert roles.role("math") is None
    assert roles.describe() == [
        ("threads", "384", "producer 4 warps + consumer 2x4 warps"),
        ("producer registers", "40", "setmaxnreg"), ("consumer registers", "232", "setmaxnreg")]


def test_the_staging_mode_follows_its_boxes():
    assert Staging().mode is StagingMode.WHOLE_TILE and Staging(2).mode is StagingMode.BOXES
    assert Staging(2).describe("g") == []  # no reason given: no row
    assert Staging(2, "why").describe("g") == [
        ("g epilogue tile", "64x64, 2 staging boxes per consumer", "why")]
    assert Staging(0, "why").describe("g")[0][1] == "the consumer's whole tile"


def test_epilogue_vectors_live_in_one_home():
    staged = EpilogueVectors(VectorHome.STAGED, ("bias", "scale"), "why")
    assert staged.held(VectorHome.STAGED) == ("bias", "scale")
    assert staged.held(VectorHome.REGISTERS) == ()
    early = EpilogueVectors(VectorHome.REGISTERS, ("bias",), "why")
    assert early.describe("g0") == [
        ("g0 epilogue vectors", "bias in registers, loaded before the mainloop", "why")]
    assert staged.describe("g")[0][1] == "bias, scale"
    assert EpilogueVectors(why="off").describe("g")[0][1] == "from global memory"
    assert EpilogueVectors().describe("g") == []


def test_overlap_rows_only_for_what_is_in_flight():
    assert Overlap().describe("g") == []
    assert _labels(Overlap(wgmma_groups=2, why="w").describe("g0")) == [
        "g0 wgmma groups in flight"]
    assert _labels(Overlap(passes=2, why="w").describe("g1")) == ["g1 column passes in flight"]


def _schedule():
    gemm = GemmSchedule(
        name="g", atom=MmaAtom(Mma.WGMMA_SS, "wgmma"),
        pipeline=Pipeline(OperandSchedule(LoadPath.TMA, why="a"),
                          OperandSchedule(LoadPath.TMA, why="b", mn_major=True), stages=4),
        output=Output(StorePath.TMA, "tma"),
        staged=StagedInput("C", late=True, why="c"),
        staging=Staging(2, "boxes"),
        passes=ColumnPasses(),
        overlap=Overlap(),
        groups=EpilogueGroups(4, "groups"),
        vectors=EpilogueVectors(VectorHome.STAGED, ("bias",), "vectors"))
    return Schedule(
        scheduler=TileScheduler(KernelKind.COOPERATIVE, Raster(8), split_k=2, why="kind"),
        warps=WarpRoles((WarpRole("producer", 4, registers=40),
                         WarpRole("consumer", 4, groups=2, registers=232))),
        gemms=(gemm,), entry=EntryPoints(True, "narrow"),
        rejected=((KernelKind.PINGPONG, "refused"),),
        chosen=(LineChoice("g tile", "128x256x64", "best"),))


def test_describe_walks_the_components_in_order():
    s = _schedule()
    assert _labels(s.describe()) == [
        "line g tile", "not pingpong",  # how it was chosen
        "kind", "raster", "min blocks per SM", "split-K",  # the tile scheduler
        "threads", "producer registers", "consumer registers",  # the warp roles
        "narrow variant",  # the entry points
        "g mma", "g A", "g B", "g stages", "g store", "g epilogue input", "g epilogue tile",
        "g epilogue groups", "g epilogue vectors"]
    rows = {label: (value, why) for label, value, why in s.describe()}
    assert rows["g B"] == ("TMA ring, MN-major", "b")
    assert rows["g epilogue input"] == ("C", "c, issued halfway through the tile's mainloop")
    assert rows["narrow variant"][1] == "narrow"
    assert s.staged_inputs == ("C",) and s.wgmma and s.multicast is None
    assert not s.consumer_order  # one gemm
