"""sm_90a emitter of chained gemms (back-to-back): the first gemm on wgmma (both operands from
shared memory through descriptors) over a resident ring of A, later gemms on wgmma with A from
registers where the plan says so (plan.wgmma_chain), and `schedule pingpong`: producer warps
fill the ring through full and empty mbarriers while two consumer warpgroups take alternate
tiles, the output leaving through the copy engine (plan.tma_store: cp.async.bulk.tensor
through a CUtensorMap). The stage scaffolding is kgen.targets.common.chain's; the template is
templates/sm90/chain.cu.j2."""
from __future__ import annotations

from ...enums import DType
from ...plan import GemmPlan, KernelPlan
from ..common import chain
from ..common.chain_mainloop import (block, cfg, function_level, resident_loads, wide_store_lines,
                                     zero_acc)
from ..common.operands import dim_expr, load_args, operand
from ..common.render import render
from ..sm80 import epilogue as epilogue_emit

# The driver's element type of a tensor map over the output.
TENSOR_MAP_DTYPE = {DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
                    DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"}


class Sm90Chain(chain.ChainTarget):
    template = "sm90/chain.cu.j2"

    def warp_var(self, plan: KernelPlan) -> str:
        return "math_warp" if plan.pingpong else "warp_id"  # ping-pong: the warp in its warpgroup

    def threads_assert(self, plan: KernelPlan) -> str:
        if not plan.pingpong:
            return super().threads_assert(plan)
        return ('static_assert(kWarpsM * kWarpsN * 32 == kWarpgroupThreads, "every stage runs '
                'on a whole consumer warpgroup");')

    def first_mainloop(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        a, b = operand(g.a, "a"), operand(g.b, "b")
        if plan.pingpong:  # the producer warps load the ring (produce_ring)
            text = render("sm90/pingpong_wgmma.inc.j2", a=a, b=b)
        else:
            text = render("sm90/ring_wgmma.inc.j2", a=a, b=b,
                          ring_load_args=load_args(g.a, "a", "load_m0", "load_k"))
        return function_level(text)

    def resident_mainloop(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        if g.name in plan.wgmma_chain:
            return resident_wgmma(g)
        return super().resident_mainloop(plan, g)

    def last_epilogue(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        if plan.tma_store:
            return tma_store_lines(g)
        if plan.wide_stores:
            return wide_store_lines(g)
        return epilogue_emit.loop_lines(plan, g)

    def persistent_body(self, plan: KernelPlan, stages: list[str]) -> list[str]:
        if plan.pingpong:
            return pingpong_body(plan, stages)
        return super().persistent_body(plan, stages)

    def evict_first(self, plan: KernelPlan) -> bool:
        # Not when the output leaves through the copy engine (tma_store, whose stores carry that
        # hint): there A's hint measured 2% slower on an H200 (bench/RESULTS.md).
        return plan.resident and not plan.tma_store

    def first_gemm_functions(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        if not plan.pingpong:
            return super().first_gemm_functions(plan, g)
        return render(
            "sm90/pingpong_producer.inc.j2", name=plan.name, a=operand(g.a, "a"),
            m_expr=dim_expr(g.m_dim), k_expr=dim_expr(g.k_dim),
            load_args=load_args(g.a, "a", "m0", "kt")).rstrip("\n").split("\n")

    def template_values(self, plan: KernelPlan) -> dict:
        first, last = plan.gemms[0], plan.gemms[-1]
        out = last.epilogue.packed_store[0] if plan.tma_store else ""
        return dict(
            quad_stores=plan.wide_stores and not plan.tma_store,
            mma_sync=any(g.name not in plan.wgmma_chain for g in plan.gemms[1:]),
            pingpong=plan.pingpong,
            tma_store=plan.tma_store,
            tma_output=out,
            tma_dtype=TENSOR_MAP_DTYPE[plan.param(out).dtype] if plan.tma_store else "",
            producer_threads=first.producer_threads,
            wgmma_n=first.tile[1],
            wgmma_regs=", ".join(f"%{i}" for i in range(first.tile[1] // 2)),
            wgmma_outs=wgmma_outs(first.tile[1]),
            wgmma_rs=[dict(n=n, regs=", ".join(f"%{i}" for i in range(n // 2)),
                           outs=wgmma_outs(n))
                      for n in sorted({g.tile[1] for g in plan.gemms
                                       if g.name in plan.wgmma_chain})],
        )


SM90 = Sm90Chain()


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    return chain.emit(SM90, plan, source_name=source_name, source_hash=source_hash,
                      command=command)


def resident_wgmma(g: GemmPlan) -> list[str]:
    """The resident chained stage on wgmma (plan.wgmma_chain): the warpgroup's rows times all
    of B, one k16 step per instruction, A from this thread's fragments, B through descriptors;
    one commit group, waited on before the epilogue reads the accumulators."""
    src = g.chain.source
    b = operand(g.b, "b")
    tiles, steps = g.chain.k // g.tile[2], g.tile[2] // 16
    lines = zero_acc() + [
        "",
        f"const unsigned b_smem = smem_address(smem.{b['buffer']}());  // all of "
        f"{g.b.param}, resident",
        *([f"constexpr unsigned kBStageBytes = BLayout::kStageElems * {b['elem_bytes']};"]
          if tiles > 1 else []),
        "",
        f"// wgmma: A is {src}'s output in registers (the m16n8k16 A fragments are wgmma's "
        "register layout",
        "// for a warp's 16 rows), B is read from shared memory; no ldmatrix.",
        "wgmma_fence();  // the A fragments and accumulators were written by ordinary "
        "instructions",
    ]
    for kt in range(tiles):
        here = f"b_smem + {kt} * kBStageBytes" if kt else "b_smem"
        for kk in range(steps):
            step = kt * steps + kk
            at = f"{here} + {kk * 32}" if kk else here
            lines.append(f"wgmma_step_rs(acc, {g.name}_a_frag[{step}][0], smem_descriptor({at}));")
    return lines + ["wgmma_commit();", "wgmma_wait<0>();"]


def tma_store_lines(g: GemmPlan) -> list[str]:
    """The last gemm's epilogue through the copy engine (plan.tma_store): the warpgroup writes
    its tile into its staging as 64x64 swizzled boxes, then one thread stores the boxes with
    cp.async.bulk.tensor. The staging is rewritten only once the copy engine has read the last
    tile's boxes. Rows past M hold zeros and are clipped by the tensor map."""
    out = g.epilogue.packed_store[0]
    return [
        f"// {out} through the copy engine: this warpgroup's staging takes the tile as 64x64 "
        "boxes (128-byte swizzle),",
        "// then one thread stores each box with cp.async.bulk.tensor.",
        f"const unsigned staging = smem_address(smem.{g.name}_d_staging()) + warpgroup * "
        "(kTileN / 64) * kStagingBoxBytes;",
        "if (tid % kWarpgroupThreads == 0) bulk_wait_read();  // the copy engine has read this "
        "warpgroup's last tile",
        "warpgroup_barrier(warpgroup);",
        "#pragma unroll",
        "for (int i = 0; i < kFragM; ++i) {",
        "#pragma unroll",
        "  for (int h = 0; h < 2; ++h) {",
        "    const int r = warp_m * kWarpTileM + i * 16 + lane / 4 + 8 * h;  // row in the tile",
        "    const bool live = m0 + r < M;  // the epilogue may read row-indexed inputs",
        "#pragma unroll",
        "    for (int j = 0; j < kFragN; ++j) {",
        "      const int c = warp_n * kWarpTileN + j * 8 + (lane % 4) * 2;  // column in the tile",
        f"      const unsigned pair = live ? {g.name}_epilogue(p, m0 + r, n0 + c, acc[i][j][2 * h], "
        "acc[i][j][2 * h + 1]) : 0u;",
        "      st_shared_b32(staging + (c / 64) * kStagingBoxBytes + staging_offset(r, c % 64), pair);",
        "    }",
        "  }",
        "}",
        "fence_proxy_async();  // written through the generic proxy, read by the copy engine",
        "warpgroup_barrier(warpgroup);",
        "if (tid % kWarpgroupThreads == 0) {",
        "#pragma unroll",
        "  for (int box = 0; box < kTileN / 64; ++box)",
        f"    tma_store_box(&maps.{out}, staging + box * kStagingBoxBytes, n0 + box * 64, m0);",
        "  bulk_commit();",
        "}",
    ]


def wgmma_outs(n: int) -> str:
    """The asm outputs of a warp's m64nNk16 accumulators, in the m16n8 layout acc[0][j][e]."""
    return ", ".join(f'"+f"(acc[0][{j}][{e}])' for j in range(n // 8) for e in range(4))


def pingpong_body(plan: KernelPlan, stages: list[str]) -> list[str]:
    """schedule pingpong: the barriers and the resident B operands, then the producer warps fill
    the ring while the two consumer warpgroups run every other tile of this CTA."""
    g0 = plan.gemms[0]
    first = cfg(g0)
    bars = f"{g0.name}_ring_barriers"
    return block([
        "// Persistent: gridDim.x CTAs (SM count x resident CTAs per SM, from the launcher) loop "
        "over the tiles.",
        "const int tiles = tiles_m * tiles_n;",
        f"const unsigned full_bar = smem_address(smem.{bars}());  // kStages full barriers,",
        f"const unsigned empty_bar = full_bar + 8 * {first}::kStages;  // then kStages empty ones",
        "if (tid == 0) {",
        f"  for (int s = 0; s < {first}::kStages; ++s) {{",
        "    mbarrier_init(full_bar + 8 * s, kProducerThreads);  // as each one's copies land",
        "    mbarrier_init(empty_bar + 8 * s, kWarpgroupThreads);  // the consuming warpgroup",
        "  }",
        "}",
        "__syncthreads();  // the barriers are initialized",
        "",
        "if (tid >= 2 * kWarpgroupThreads) {  // the producers: A streams in while the consumers "
        "wait for B",
        f"  {first}::produce_ring(p, smem, tiles_m, tiles_n, full_bar, empty_bar, "
        "tid - 2 * kWarpgroupThreads);",
        "  return;",
        "}",
        "// The first warpgroup loads the resident operands; both wait for them.",
        "if (warp_id < 4) {",
        *block(resident_loads(plan) + [
            "cp_async_wait<0>();", "fence_proxy_async();  // read by wgmma, through the async proxy"]),
        "}",
        "consumer_barrier();  // B is in shared memory",
        "const int warpgroup = warp_id / 4;",
        "const int math_warp = warp_id % 4;",
        "int local = warpgroup;  // this warpgroup's tiles are the CTA's local tiles local, local + 2, ...",
        "for (int tile = blockIdx.x + warpgroup * gridDim.x; tile < tiles; tile += 2 * gridDim.x, "
        "local += 2) {",
        *block([
            "int tile_m, tile_n;",
            "tile_coords(tile, tiles_m, tiles_n, tile_m, tile_n);",
            f"const int m0 = tile_m * {first}::kTileM;",
            "",
            *stages,
        ]),
        "}",
        *(["if (tid % kWarpgroupThreads == 0) bulk_wait();  // this warpgroup's last stores are "
           "complete"] if plan.tma_store else []),
    ])
