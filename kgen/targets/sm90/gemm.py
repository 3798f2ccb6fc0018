"""sm_90a emitter of one gemm on the warp-specialized schedules (COOPERATIVE, PINGPONG; see
kgen/targets/sm90/warp_specialized.py): a producer warpgroup fills the ring by TMA, two consumer
warpgroups run wgmma and the epilogue DAG in registers, the output leaving through the copy
engine or as pair stores. Everything the template prints is prepared here from the plan; the
template is templates/sm90/gemm.cu.j2."""
from __future__ import annotations

from ...enums import Axis, Layout
from ...plan import GemmPlan, KernelPlan, StorePath, TensorLoad, VectorLoad, staged_vector_buffer
from ..common import arch_guard, batch, epilogue_cpp, host_api
from ..common.operands import MMA_TYPE, dim_expr, header, host_checks, storage_asserts
from ..common.render import render, render_lines
from ..sm80 import epilogue as sm80_epilogue
from . import schedules, tensor_map
from .chain import wgmma_outs
from .warp_specialized import WARPGROUP, odd_n8, part_box, vector_extent

# Per axis: the reduction helper of templates/sm90/reduce.inc.j2, its arguments past the
# partials and the output, and (deterministic mode) the CTA's workspace slot and its length
_REDUCE = {
    Axis.ROW: ("reduce_rows", "m0 + row0 + warp * 16 + lane / 4, M, lane", "tile_n", "M"),
    Axis.COL: ("reduce_cols", "{scratch}, n0, N, lane, consumer_warp, consumer_tid", "tile_m", "N"),
    Axis.ALL: ("reduce_all", "{scratch}, lane, consumer_warp, consumer_tid",
               "tile_m * tiles_n + tile_n", "1"),
}
_SLOTS = {Axis.ROW: "tiles_n", Axis.COL: "tiles_m", Axis.ALL: "tiles_m * tiles_n"}


def reduction_lines(plan: KernelPlan, g: GemmPlan, params: str = "p") -> list[str]:
    """Each reduction's tile partial to the output (atomic) or to the CTA's workspace slot
    (of `params`: the tile's batch of the arguments)."""
    reds = g.epilogue.reductions
    if not reds:
        return []
    atomic = "false" if plan.deterministic else "true"
    lines = ["long long ws_offset = 0;"] if plan.deterministic and len(reds) > 1 else []
    for r in reds:
        helper, args, slot, length = _REDUCE[r.axis]
        args = args.format(scratch=f"smem.{r.scratch}()")
        out = f"{params}.{r.target}"
        if plan.deterministic:
            offset = " + ws_offset" if len(reds) > 1 else ""
            out = f"{params}.workspace{offset} + (long long)({slot}) * {length}"
        lines.append(f"{helper}<{sm80_epilogue.OP_STRUCT[r.op]}, {atomic}>(red{r.index}_part, {out}, {args});")
        if plan.deterministic and len(reds) > 1 and r is not reds[-1]:
            lines.append(f"ws_offset += (long long)({_SLOTS[r.axis]}) * {length};")
    return lines


def epilogue_loop(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The consumers' epilogue: pair stores (and the reductions); with a TMA store, the staging
    in the fast entry point and pair stores in the narrow one."""
    params = "pb" if batch.batched(plan) else "p"  # the tile's batch of the arguments
    # made here, not before the mainloop: its pointers hold no registers through the wgmma
    head = ([f"const {plan.name}_params pb = at_batch(p, batch);  // this tile's batch of the "
             "arguments"] if batch.batched(plan) else [])
    head = stream_fixup(plan) + head
    if plan.schedule.split_k > 1:  # the unit's partial sums; <kernel>_splitk runs the epilogue
        return head + sm80_epilogue.split_partial_lines(
            "m0 + row0 + i * 64 + warp * 16 + lane / 4", "n0 + j * 8 + (lane % 4) * 2", params)
    groups = plan.schedule.gemm(g.name).epilogue_groups
    if plan.schedule.gemm(g.name).stages_d and groups > 1 and groups != g.tile[1] // 64:
        raise ValueError(f"{g.name}: the epilogue tile's groups are its {g.tile[1] // 64} boxes, "
                         f"not {groups}")
    pairs = (sm80_epilogue.partial_lines(g)
             + sm80_epilogue.pair_loop(g, "m0 + row0 + i * 64 + warp * 16 + lane / 4",
                                       "n0 + j * 8 + (lane % 4) * 2", narrow=True, params=params,
                                       groups=groups)
             + reduction_lines(plan, g, params))
    if plan.schedule.gemm(g.name).store is not StorePath.TMA:
        return head + pairs
    packed = g.epilogue.packed_store
    out, col = packed.param, packed.layout is Layout.COL
    batched_out = plan.param(out).batch is not None
    c = plan.schedule.gemm(g.name).staged_input
    staged = render_lines("sm90/gemm_tma_store.inc.j2", out=out,
                          staging=f"{g.name}_d_staging", name=g.name, params=params,
                          store_box="tma_store_box_3d" if batched_out else "tma_store_box",
                          store_batch=f", map_batch(p.batch_{out}, batch)" if batched_out else "",
                          staged=c or "", col=col,
                          whole_chunks=whole_chunks(col), vector_args=vector_args(plan, g),
                          reads_memory=staging_reads_memory(plan, g),
                          stages_d=plan.schedule.gemm(g.name).stages_d, groups=groups,
                          part_box=bool(part_box(g)), odd_n8=odd_n8(g))
    staged = vector_writes(plan, g) + staged
    return head + (["if constexpr (kNarrow) {  // no copy engine: pair stores"]
            + [f"  {line}" for line in pairs] + ["} else {"]
            + [f"  {line}" if line else line for line in staged] + ["}"])


def staging_reads_memory(plan: KernelPlan, g: GemmPlan) -> bool:
    """Whether the staging epilogue reads global memory at a pair's row or column: a vector
    or an input shaped like the output that is not staged in shared memory. Only then does it
    skip the pairs past M or N; otherwise it computes every pair, branch-free, and the copy
    engine's store leaves those out (the pairs' predicates and branches had kept the compiler
    from interleaving them: 6194 against 3216 cycles per tile for relu(alpha*acc + beta*C +
    bias[col]) on an H100, bench/RESULTS.md)."""
    gs = plan.schedule.gemm(g.name)
    for n in g.epilogue.nodes:
        if isinstance(n.kind, VectorLoad) and n.kind.param not in gs.staged_vectors:
            return True
        if isinstance(n.kind, TensorLoad) and n.kind.param != gs.staged_input:
            return True
    return False


def _staged_vectors(plan: KernelPlan, g: GemmPlan) -> list[tuple[str, Axis, str, int]]:
    """(param, axis, element C++ type, elements per consumer) of each staged epilogue vector
    (Schedule: GemmSchedule.staged_vectors), in the schedule's order."""
    staged = plan.schedule.gemm(g.name).staged_vectors
    kinds = {n.kind.param: n.kind for n in g.epilogue.nodes if isinstance(n.kind, VectorLoad)}
    return [(v, kinds[v].axis, kinds[v].dtype.cpp, vector_extent(kinds[v].axis,
                                                                 plan.schedule.kind, g.tile))
            for v in staged]


def _vector_loop(extent: int, body: str) -> list[str]:
    """`body` for each of this thread's elements `at` of a consumer's slice of `extent`
    elements (`e`: which of the thread's), where `at` lies in the slice."""
    count = -(-extent // WARPGROUP)
    if extent % WARPGROUP:
        body = f"if (at < {extent}) {body}"
    return ["#pragma unroll",
            f"for (int e = 0; e < {count}; ++e) {{",
            "  const int at = tid % kWarpgroupThreads + e * kWarpgroupThreads;",
            f"  {body}", "}"]


def vector_loads(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """At each tile's start, before the mainloop: each consumer thread's elements of the staged
    vectors' slices (the tile's columns, or the consumer's rows), loaded into registers that
    the loads fill while the mainloop runs."""
    lines = []
    for v, axis, ctype, extent in _staged_vectors(plan, g):
        first, size = ("n0", "N") if axis is Axis.COL else ("m0 + row0", "M")
        base = (f"static_cast<long long>(batch) * p.batch_{v} + "
                if plan.param(v).batch is not None else "")
        lines += [f"// {v}[{axis.value}]: this thread's elements of the slice, held through the "
                  "mainloop (written to shared memory before the epilogue)",
                  f"{ctype} held_{v}[{-(-extent // WARPGROUP)}] = {{}};"]
        lines += _vector_loop(extent, f"if ({first} + at < {size}) held_{v}[e] = "
                              f"p.{v}[{base}{first} + at];")
    return lines


def vector_writes(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """Before the fast entry point's epilogue: the held elements to the consumer's buffers,
    once every thread of the consumer is past the last tile's reads, and a barrier before the
    epilogue reads them."""
    vectors = _staged_vectors(plan, g)
    if not vectors:
        return []
    lines = ["// The staged vectors: every thread of this consumer is past the last tile's "
             "reads; each writes its elements", "warpgroup_barrier(consumer);"]
    for v, axis, ctype, extent in vectors:
        lines.append(f"{ctype}* const sv_{v} = smem.{staged_vector_buffer(g.name, v)}() + "
                     f"consumer * {extent};")
        lines += _vector_loop(extent, f"sv_{v}[at] = held_{v}[e];")
    return lines + ["warpgroup_barrier(consumer);  // the epilogue reads them"]


def packed_vector_params(plan: KernelPlan, g: GemmPlan) -> str:
    """The packed epilogue function's parameters for the staged vectors: each one's slice and
    the origins it is indexed from."""
    vectors = _staged_vectors(plan, g)
    params = "".join(f", const {ctype}* sv_{v}" for v, _, ctype, _ in vectors)
    axes = {axis for _, axis, _, _ in vectors}
    return (params + (", int tile_col0" if Axis.COL in axes else "")
            + (", int tile_row0" if Axis.ROW in axes else ""))


def vector_args(plan: KernelPlan, g: GemmPlan) -> str:
    """The arguments to packed_vector_params at the call sites: the buffers and the tile's first
    column, the consumer's first row."""
    vectors = _staged_vectors(plan, g)
    axes = {axis for _, axis, _, _ in vectors}
    return ("".join(f", sv_{v}" for v, _, _, _ in vectors)
            + (", n0" if Axis.COL in axes else "") + (", m0 + row0" if Axis.ROW in axes else ""))


def whole_chunks(col: bool) -> str:
    """When the copy engine may store a tile from the staging: it writes whole 16-byte chunks
    of the contiguous dimension, so a tile whose last columns (rows, column-major) end inside
    one is copied out of the staging by the consumer's threads instead (copy_box_out)."""
    if col:
        return "m0 + kTileM <= M || M % 8 == 0"
    return "n0 + kTileN <= N || N % 8 == 0"


def tile_start(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """At each tile's start, before the mainloop: the staged vectors' loads into registers
    (GemmSchedule.staged_vectors), then the staged input's load (_staged_input_start)."""
    return vector_loads(plan, g) + _staged_input_start(plan, g)


def _staged_input_start(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The staged input's load into the output's staging (Schedule: GemmSchedule.staged_input),
    if any; under a cluster, only for a tile in range (a tile past M or N runs no epilogue, so
    nothing would wait for the load)."""
    gs = plan.schedule.gemm(g.name)
    c = gs.staged_input
    if c is None:
        return []
    batched = plan.param(c).batch is not None
    col = g.epilogue.packed_store.layout is Layout.COL
    values = dict(param=c, staging=f"{g.name}_d_staging",
                  load_box="tma_load_box_3d" if batched else "tma_load_box",
                  prefetch_box="tma_prefetch_box_3d" if batched else "tma_prefetch_box",
                  prefetch_when=_prefetch_when(plan, c),
                  load_batch=f", map_batch(p.batch_{c}, batch)" if batched else "",
                  cluster=plan.schedule.cluster_size > 1, col=col, stages_d=gs.stages_d)
    lines = render_lines("sm90/staged_input.inc.j2", **values)
    # the epilogue tile's loads of one box each, here and in the epilogue
    boxes = render_lines("sm90/staged_input_box.inc.j2", **values) if gs.stages_d else []
    first = _epilogue_share(plan)
    if not gs.staged_input_late:
        if not first:
            return boxes + lines
        return boxes + (["if (k_first == 0) {  // stream-K: the share that runs the tile's epilogue"]
                        + [f"  {line}" if line else line for line in lines] + ["}"])
    return boxes + (["// issued halfway through the mainloop (mainloop_staged), or here when K has no k "
             "tile", "const auto load_staged = [&]() {"]
            + [f"  {line}" if line else line for line in lines]
            + ["};", f"if (k_tiles == 0{first}) load_staged();"])


# The epilogue tile's staged input: its boxes past the first kStagesD load during the epilogue,
# each waited on there. Where the input is larger than L2 they come from device memory; then
# they are prefetched into L2 when the first ones load, halfway through the mainloop. H100,
# relu(alpha*acc + beta*C + bias[col]) (bench/logs/issue15_h100/c_prefetch.log): 8192^3 (C 128
# MB) 1.634 -> 1.539 ms, 8192x8192x4096 0.788 -> 0.781; where C fits in L2 the prefetch cost
# 1.2-1.4% (4096^3, C 32 MB; 6144x5120x3072, 60 MB), so it runs from 64 MB of the input on
# (an H100 has 50 MB of L2, an H200 60 MB).
PREFETCH_BYTES = 64 << 20


def _prefetch_when(plan: KernelPlan, param: str) -> str:
    """The C++ condition, in the consumers, under which the staged input's later boxes are
    prefetched into L2: the whole input (every batch) at least PREFETCH_BYTES."""
    g = plan.gemms[0]
    batches = batch.batch_count(plan)
    size = (f"static_cast<long long>({dim_expr(g.m_dim)}) * {dim_expr(g.n_dim)}"
            + (f" * {batches}" if batches != "1" else "") + f" * sizeof(*p.{param})")
    return f"{size} >= ({PREFETCH_BYTES >> 20}ll << 20)"


def mainloop_staged(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """In the consumers' mainloop, after a k tile's wgmma group is issued: the staged input's
    load, halfway through (GemmSchedule.staged_input_late), once the previous tile's output
    has had time to leave the staging."""
    gs = plan.schedule.gemm(g.name)
    if gs.staged_input is None or not gs.staged_input_late:
        return []
    return [f"if (kt == k_tiles / 2{_epilogue_share(plan)}) load_staged();  // the staged "
            "input, halfway"]


def _epilogue_share(plan: KernelPlan) -> str:
    """A condition to add to the staged input's load: under stream-K only the share that holds
    a tile's first k tile runs its epilogue (and so waits for the load)."""
    return " && k_first == 0" if plan.schedule.stream_k else ""


def _tma_load(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, row: str,
              mn_major: bool = False, extent: str = "", multicast: str = "",
              boxes: tuple[str, str] | None = None) -> str:
    """The producer's copy-engine load of one operand's k tile (rank 3 for a batched one): one
    box K-major; MN-major, `extent` / 64 boxes of 64 M (or N) columns by the k tile's rows (or
    the range `boxes` of them). `multicast`: the CTA mask the boxes are written to (every CTA
    of the cluster)."""
    k = f"{k_tile(plan)} * kTileK"
    dst, coords = f"{ring} + s * {stage_bytes}", f"{k}, {row}"
    if mn_major:
        dst, coords = f"{dst} + j * kMnBoxBytes", f"{row} + 64 * j, {k}"
    head = f"{dst}, &maps.{operand}, full + 8 * s, {coords}"
    suffix, tail = ("_multicast", f", {multicast}") if multicast else ("", "")
    if plan.param(operand).batch is None:
        load = f"tma_load_box{suffix}({head}{tail});"
    else:
        load = f"tma_load_box_3d{suffix}({head}, map_batch(p.batch_{operand}, batch){tail});"
    if not mn_major:
        return load
    first, last = boxes or ("0", f"{extent} / 64")
    return f"for (int j = {first}; j < {last}; ++j) {load}"


def k_tile(plan: KernelPlan) -> str:
    """The producer's k tile at step kt of a tile's (split-K, stream-K: of its unit's part)."""
    return "(k_first + kt)" if plan.schedule.split_k > 1 or plan.schedule.stream_k else "kt"


def stream_values(plan: KernelPlan) -> dict:
    """What the template prints about stream-K (templates/sm90/stream_k.inc.j2): the CTA's
    share of the walk's steps and, per tile, the part of its k tiles the share holds."""
    if not plan.schedule.stream_k:
        return dict(stream_k=False, stream_head=[])
    tiles = "walk" if batch.batched(plan) else "tiles"  # every batch's
    return dict(
        split_k=1, stream_k=True, stream_flags=plan.STREAM_FLAGS, k_tile=k_tile(plan),
        k_tiles_total="k_tiles_all",
        stream_head=[
            "// Stream-K (stream_walk): this CTA's share [sk_begin, sk_end) of the first sk_tiles "
            "tiles' steps,",
            "// then its data-parallel tiles up to sk_stop",
            "const int k_walk = max(k_tiles_all, 1);  // a tile's steps",
            f"const int sk_tiles = stream_tiles({tiles});",
            "const long long steps = static_cast<long long>(sk_tiles) * k_walk;",
            "long long sk_begin, sk_end, sk_stop;",
            f"stream_walk({tiles}, k_walk, sk_tiles, sk_begin, sk_end, sk_stop);"],
        unit_k=["const int k_tiles = min(part, k_tiles_all - k_first);  // none when K = 0"])


def stream_fixup(plan: KernelPlan) -> list[str]:
    """Stream-K, before the epilogue: a later part of a tile leaves its sums for the share
    that began it; that share waits for every later part, adds them in order, then runs the
    epilogue."""
    if not plan.schedule.stream_k:
        return []
    return [
        "// Stream-K: the shares' slots of kTileM x kTileN floats, then their flags",
        "int* const flags = reinterpret_cast<int*>(p.workspace + static_cast<long long>(gridDim.x) "
        "* kTileM * kTileN);",
        "const int share = gridDim.x - 1 - blockIdx.x;",
        "if (k_first > 0) {  // a later part: to this share's slot, for the share that began the tile",
        "  stream_store(acc, p.workspace + static_cast<long long>(share) * kTileM * kTileN,",
        "               flags + share * kStreamFlags + consumer_warp, consumer_tid, lane);",
        "  continue;",
        "}",
        "if (part < k_walk) {  // begun here, ended by the shares after this one: add their parts in order",
        "  const int last = stream_owner(static_cast<long long>(tile + 1) * k_walk - 1, steps);",
        "  stream_wait(flags, share + 1, last, consumer_warp, lane);",
        "  stream_add(acc, p.workspace, share + 1, last, consumer_tid);",
        "}",
    ]


def split_values(plan: KernelPlan) -> dict:
    """What the template prints about split-K: the walk over units (part u % kSplitK of tile
    u / kSplitK's k tiles), each unit's k tiles, and the name of the kernel's k tile count."""
    split = plan.schedule.split_k
    if plan.schedule.stream_k:
        return stream_values(plan)
    if split == 1:
        return dict(split_k=1, unit_k=[], k_tile="kt", k_tiles_total="k_tiles", stream_k=False,
                    stream_head=[])
    batched = batch.batched(plan)
    per_batch = "tiles_m * tiles_n * kSplitK"
    tile_batch = [f"const int batch = tile / ({per_batch});"] if batched else []
    in_batch = f"tile % ({per_batch}) / kSplitK" if batched else "tile / kSplitK"
    # the walk's units (each batch's): tiles x kSplitK, or on clusters each cluster tile's parts
    # (the cluster's CTAs take the same part of their own tiles, so the operand they share
    # covers the same k tiles); the narrow producer walks tiles without clusters (tile_batch)
    units = "cluster_units" if plan.schedule.cluster_size > 1 else "units"
    walk_batch = [f"const int batch = tile / {units};"] if batched else []
    walk_in_batch = f"tile % {units} / kSplitK" if batched else "tile / kSplitK"
    return dict(
        split_k=split, k_tile=k_tile(plan), k_tiles_total="k_tiles_all", stream_k=False,
        stream_head=[], walk_tiles=units, walk="walk" if batched else units,
        walk_batch=walk_batch, walk_in_batch=walk_in_batch, tile_batch=tile_batch,
        tile_in_batch=in_batch,
        unit_k=["const int split = tile % kSplitK;  // this unit's part of its tile's k tiles",
                "const int k_per_split = (k_tiles_all + kSplitK - 1) / kSplitK;",
                "const int k_first = min(split * k_per_split, k_tiles_all);",
                "const int k_tiles = min(k_per_split, k_tiles_all - k_first);  // the last "
                "parts shorter, or none"])


def host_tiles(plan: KernelPlan) -> str:
    """The launcher's count of the walk's units (the persistent grid takes at most this many
    CTAs): tiles, split-K parts, or stream-K steps (each tile's k tiles, at least one)."""
    schedule, ns = plan.schedule, f"{plan.name}_kgen"
    if schedule.stream_k:
        return host_api.stream_units(plan)
    return batch.grid_count(plan, "tiles_m * tiles_n" + (
        f" * {ns}::kSplitK" if schedule.split_k > 1 else ""))


def _descriptor(mn_major: bool, stage: str, rows: str = "") -> str:
    """The wgmma descriptor of k16 step kk of an operand's stage (`rows`: the offset of its m64
    half). K-major: 16 elements (32 bytes) along the 128-byte rows; MN-major: 16 rows of 128
    bytes (two 8-row swizzle atoms)."""
    if mn_major:
        return f"smem_descriptor_mn({stage}{rows} + 16 * 128 * kk)"
    return f"smem_descriptor({stage}{rows} + 32 * kk)"
def _whole_loads(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, rows: str,
                 first: str, shared: bool, mn_major: bool) -> list[str]:
    """The loads of one operand's k tile by a CTA without a cluster (the narrow entry point's):
    its boxes; for a K-major operand a cluster shares (its box half the tile's rows), both
    halves."""
    if not shared or mn_major:  # an MN-major operand's boxes are 64 columns, shared or not
        return [_tma_load(plan, operand, ring, stage_bytes, first, mn_major, rows)]
    return [_tma_load(plan, operand, ring, stage_bytes, first),
            _tma_load(plan, operand, f"{ring} + {stage_bytes} / 2", stage_bytes,
                      f"{first} + {rows} / 2")]


def _loads(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, rows: str, first: str,
           shared: bool, mn_major: bool) -> list[str]:
    """The producer's loads of one operand's k tile: its boxes, or for the operand a cluster
    shares, this CTA's half multicast to every CTA: half the rows of a K-major tile, half the
    64-column boxes of an MN-major one (the narrow entry point, without a cluster, loads the
    whole tile itself)."""
    whole = _whole_loads(plan, operand, ring, stage_bytes, rows, first, shared, mn_major)
    if not shared:
        return whole
    mask = f"0x{(1 << plan.schedule.cluster_size) - 1:x}"
    if mn_major:
        half = f"{rows} / 128"  # boxes per CTA
        half_load = _tma_load(plan, operand, ring, stage_bytes, first, True, rows, multicast=mask,
                              boxes=(f"rank * ({half})", f"(rank + 1) * ({half})"))
    else:
        half_load = _tma_load(plan, operand, f"{ring} + rank * ({stage_bytes} / 2)", stage_bytes,
                              f"{first} + rank * ({rows} / 2)", multicast=mask)
    return ["if constexpr (kNarrow) {  // no cluster: the whole tile",
            *("  " + line for line in whole),
            "} else {  // this CTA's half, into every CTA of the cluster",
            "  " + half_load,
            "}"]


def cluster_values(plan: KernelPlan) -> dict:
    """What the template prints about clusters: the walk over cluster tiles (the plain walk
    over tiles without one) and the slots' release."""
    schedule = plan.schedule
    batched = batch.batched(plan)
    tile_batch = ["const int batch = tile / (tiles_m * tiles_n);"] if batched else []
    tile_in_batch = "tile % (tiles_m * tiles_n)" if batched else "tile"
    if schedule.cluster_size == 1:
        return dict(walk_tiles="tiles", walk="walk" if batched else "tiles",
                    walk_first="blockIdx.x", walk_step="gridDim.x", walk_batch=tile_batch,
                    walk_in_batch=tile_in_batch, walk_dims="tiles_m, tiles_n", cluster_tile=[],
                    release="mbarrier_arrive", releaser="tid % kWarpgroupThreads == 0",
                    tile_batch=tile_batch,
                    tile_in_batch=tile_in_batch)
    cm, cn = schedule.cluster
    along, count = ("m", "kCtasM") if cm > 1 else ("n", "kCtasN")
    shared = {"a": "A (the same tile rows)", "b": "B (the same tile columns)"}[schedule.multicast]
    return dict(
        cluster_m=cm, cluster_n=cn,
        cluster_note=f"they share {shared}, each CTA loading half of it for both",
        walk_tiles="cluster_tiles", walk="walk" if batched else "cluster_tiles",
        walk_first="cluster_id", walk_step="clusters",
        walk_batch=["const int batch = tile / cluster_tiles;"] if batched else [],
        walk_in_batch="tile % cluster_tiles" if batched else "tile",
        walk_dims="cluster_tiles_m, cluster_tiles_n",
        cluster_tile=[f"tile_{along} = tile_{along} * {count} + rank;  // this CTA's tile of "
                      "the cluster's (past M or N: its loads read zeros, it stores nothing)"],
        release="release_slot<kNarrow>", releaser="releaser", tile_batch=tile_batch,
        tile_in_batch=tile_in_batch)


def _in_range(lines: list[str]) -> list[str]:
    """The epilogue of a tile that lies past M or N is skipped: a cluster's other CTA reaches
    it when the tiles do not divide into whole cluster tiles."""
    return (["if (tile_m < tiles_m && tile_n < tiles_n) {  // past M or N: nothing to store"]
            + [f"  {line}" if line else line for line in lines] + ["}"])


def _pitch(plan: KernelPlan, operand: str) -> str:
    """What copy_granule takes of an operand's rows besides its address: the leading dimension,
    and, batched, the batch stride too (every batch's rows as aligned as the first's)."""
    if plan.param(operand).batch is None:
        return f"p.ld_{operand}"
    return f"p.ld_{operand} | p.batch_{operand}"


# The narrow producer's K-major box loop (copy_box_granule): passes unrolled, each pass's copies
# with their own registers, so that more of them are in flight (each cp.async holds its
# registers until the load unit takes it). H100, bench/prototypes/narrow_unroll.py: 8 against 4
# ran gemm_b_row 4096x4096x4092 0.354 against 0.475 ms, gemm 0.571 against 0.611. Unrolled 16
# times the 40-register producer spills; a batched kernel's batch pointers spill at 8 (40 B in
# batched_gemm_bias), so it keeps 4.
NARROW_UNROLL, NARROW_UNROLL_BATCHED = 8, 4


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    g = plan.gemms[0]
    schedule = plan.schedule
    staged = schedule.gemm(g.name).store is StorePath.TMA
    assert schedule.narrow, "a one-gemm kernel has a narrow entry point"
    body = epilogue_cpp.function_body(epilogue_cpp.render(g.epilogue, narrow="kNarrow"), False)
    c = schedule.gemm(g.name).staged_input
    packed = (epilogue_cpp.function_body(
        epilogue_cpp.render(g.epilogue, narrow="false", staged=c,
                            vectors=schedule.gemm(g.name).staged_vectors), True)
              if staged else [])
    buffers = [dict(name=b.name, role=b.role, live=plan.storage.live_text(b), offset=b.offset,
                    bytes=b.bytes, ctype=b.dtype.cpp if b.dtype is not None else "unsigned char")
               for b in plan.storage.buffers]
    consumer, producer = schedule.role("consumer"), schedule.role("producer")
    batched = batch.batched(plan)
    maps = tensor_map.template_maps(schedule.tensor_maps, dim_expr, plan)
    n = g.tile[1]
    a_mn, b_mn = schedule.gemm(g.name).a.mn_major, schedule.gemm(g.name).b.mn_major
    majors = {(False, False): "A and B K-major", (True, True): "A and B MN-major (transposed)",
              (True, False): "A MN-major (transposed), B K-major",
              (False, True): "A K-major, B MN-major (transposed)"}[(a_mn, b_mn)]
    clusters = cluster_values(plan) | split_values(plan)
    multicast = schedule.multicast
    loop = epilogue_loop(plan, g)
    host_cluster_tiles = batch.grid_count(
        plan, f"((tiles_m + {plan.name}_kgen::kClusterM - 1) / {plan.name}_kgen::kClusterM) * "
        f"((tiles_n + {plan.name}_kgen::kClusterN - 1) / {plan.name}_kgen::kClusterN)"
        + (f" * {plan.name}_kgen::kSplitK" if schedule.split_k > 1 else ""))
    return render(
        "sm90/gemm.cu.j2",
        header=header(plan, source_name, source_hash, command),
        name=plan.name,
        ns=f"{plan.name}_kgen",
        kind_note=f"{schedule.kind.value} ({schedule.why_kind})",
        tile_m=g.tile[0], tile_n=n, tile_k=g.tile[2],
        stages=g.stages,
        group_m=schedule.raster.group_m,
        smem_bytes=plan.smem_bytes,
        threads=schedule.threads,
        producer_registers=producer.registers,
        consumer_registers=consumer.registers,
        consumers=consumer.groups,  # the consumer barrier's warpgroups
        consumers_word=schedules.CONSUMER_WORDS[consumer.groups],
        pingpong=schedule.pingpong,
        a_bytes=g.a.dtype.nbytes, b_bytes=g.b.dtype.nbytes,
        a_smem=g.a.smem.name, b_smem=g.b.smem.name, a_param=g.a.param, b_param=g.b.param,
        barriers=f"{g.name}_ring_barriers",
        maps=maps,
        map_steps=tensor_map.steps_lines(maps),
        map_names=tensor_map.names(schedule.tensor_maps),
        tma_store=staged,
        stages_d=schedule.gemm(g.name).stages_d,
        epilogue_groups=schedule.gemm(g.name).epilogue_groups,
        stmatrix=staged,  # the staging written by stmatrix
        copy_out=staged,  # a tile the copy engine cannot store, copied out of it (copy_box_out)
        part_box=bool(staged and part_box(g)),  # copied out by the threads
        odd_n8=odd_n8(g),
        stmatrix_trans=staged and g.epilogue.packed_store.layout is Layout.COL,  # transposed
        staged=c or "",
        packed_params=(f", unsigned staged_{c}" if c else "") + packed_vector_params(plan, g),
        tile_start=tile_start(plan, g),
        mainloop_staged=mainloop_staged(plan, g),
        reductions=bool(g.epilogue.reductions),
        buffers=buffers,
        storage_asserts=storage_asserts(plan),
        mma_types=f"{g.a.dtype.dsl_name} x {g.b.dtype.dsl_name} -> f32",
        mma_ab=MMA_TYPE[g.a.dtype],
        wgmma_n=n,
        wgmma_acc=f"float (&acc)[{n // 8}][4]",
        wgmma_regs=", ".join(f"%{i}" for i in range(n // 2)),
        wgmma_outs=wgmma_outs(n, "acc"),
        wgmma_rs=[],
        gemm_name=g.name,
        epilogue=body,
        packed_epilogue=packed,
        epilogue_params=sm80_epilogue.epilogue_params(g),
        epilogue_loop=_in_range(loop) if schedule.cluster_size > 1 else loop,
        init_kernel=sm80_epilogue.init_kernel(plan)
        + sm80_epilogue.finalize_kernel(plan, dim_expr(g.m_dim), dim_expr(g.n_dim))
        + sm80_epilogue.split_kernel(plan, g, dim_expr(g.m_dim), dim_expr(g.n_dim)),
        host_init=sm80_epilogue.host_init_lines(plan),
        host_empty=sm80_epilogue.host_empty_lines(plan),
        # split-K's kernel first: the finalize kernel combines the slots it writes
        host_finalize=sm80_epilogue.host_split_lines(plan, dim_expr(g.m_dim), dim_expr(g.n_dim))
        + sm80_epilogue.host_finalize_lines(plan),
        **host_api.template_values(plan),
        persistent=True,
        arch_guard=arch_guard.guard(plan),
        summary=(f"{g.name} = {g.a_name} @ {g.b_name}, CTA tile {g.tile[0]}x{n}x{g.tile[2]}, "
                 f"{schedule.kind.value}"),
        min_blocks=schedule.min_blocks_per_sm,
        m_expr=dim_expr(g.m_dim), n_expr=dim_expr(g.n_dim), k_expr=dim_expr(g.k_dim),
        host_m_expr=dim_expr(g.m_dim), host_n_expr=dim_expr(g.n_dim),
        host_checks=host_checks(plan),
        batched=batched,
        batches=batch.batch_count(plan),
        **clusters,
        tile_params="pb" if batched else "p",
        at_batch=batch.at_batch_lines(plan),
        a_pitch=_pitch(plan, g.a.param), b_pitch=_pitch(plan, g.b.param),
        narrow_unroll=NARROW_UNROLL_BATCHED if batched else NARROW_UNROLL,
        # the epilogue tile's staged input: its boxes past the buffers are prefetched into L2
        prefetch_staged=bool(c and schedule.gemm(g.name).stages_d),
        **{f"{w}_load{suffix}": loads(plan, param, f"{w}_ring", f"k{W}StageBytes", f"kTile{mn}",
                                      f"tile_{mn.lower()} * kTile{mn}", multicast == w, major)
           for loads, suffix in ((_loads, ""), (_whole_loads, "_whole"))
           for w, W, mn, param, major in (("a", "A", "M", g.a.param, a_mn),
                                          ("b", "B", "N", g.b.param, b_mn))},
        a_mn=a_mn, b_mn=b_mn,
        mn_descriptor=a_mn or b_mn,
        wgmma_trans=f"{int(a_mn)}, {int(b_mn)}",
        wgmma_majors=majors,
        a_descriptor=_descriptor(a_mn, "a_stage", " + i * 64 * 128"),
        b_descriptor=_descriptor(b_mn, "b_stage"),
        k_step_note=("k16 step kk is 32 bytes along the 128-byte rows" if not (a_mn or b_mn)
                     else "k16 step kk: " + "; ".join(
                         f"{w} {'2048 bytes on (16 rows)' if mn else '32 bytes on'}"
                         for w, mn in (("A", a_mn), ("B", b_mn)))),
        host_cluster_tiles=host_cluster_tiles,
        host_batches=batch.host_lines(plan),
        host_tiles=host_tiles(plan),
    )
