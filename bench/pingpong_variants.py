"""Variants of the emitted `schedule pingpong` kernel, edited as text, checked and timed in one
process (issue 5's floor target). Each variant is the emitted .cu of
examples/b2b_gemm_rf_pingpong_sm90a.kg with named edits applied; the edits are asserted to
match exactly once, so a change in the emitter makes this script fail rather than time the
wrong thing. Timing-only variants (marked) skip the check.

    python3 bench/pingpong_variants.py [--m 81920] [--only NAME,NAME] [--json FILE]

Edits (combine with "+"; each asserts that its anchor text matches once):
  grid=N     N persistent CTAs instead of one per SM (1280 tiles: 128 CTAs take 10 each)
  stages=N   the example built with `stages N` (the planner places the ring)
  ring=N     A's ring with N slots instead of 16
  tma        A through the copy engine: one thread per CTA waits on the empty barrier, arms the
             full barrier with the slot's bytes and issues cp.async.bulk.tensor (2-D tensor map
             of A, 128-byte swizzle, box 64x64); the map lives in a __device__ table, one entry
             per input set, found by A's address
  tmastore   D1 staged in shared memory (two 64x64 halves per warpgroup, 128-byte swizzle, in the
             ring's last 4 slots: needs ring=12) and written by two cp.async.bulk.tensor stores;
             the staging is reused after cp.async.bulk.wait_group.read
  bulkstore  the same staging with 256-byte rows, one cp.async.bulk store per row (ring=12)
  coalesce   D1 through a 2 KB staging per warp, then 512 contiguous bytes per store instruction
             (ring=15, shared memory past the plan's)
  hoist      scale0 and bias0 copied to shared memory once per CTA (memory past the plan's)
  ldg        scale0 and bias0 read through __ldg
  split      warpgroup 0 runs g0 for every tile and hands its output to warpgroup 1 through two
             8 KB buffers; warpgroup 1 runs g1 (wgmma, both operands in shared memory) and
             stores (ring=14)
  trace      clock64 stamps per warpgroup and tile, and the producer's empty waits; printed
  batch      the producer waits for all of a tile's slots, then copies A row by row (each row's
             9 chunks of 128 bytes back to back) and arms the tile's full barriers
  l2pf=D     producer thread 0 prefetches into L2, with one cp.async.bulk.prefetch, all the rows
             of the tile D rounds ahead (A's rows are contiguous at these shapes)
  contig     each slot reads 8 KB of A that are contiguous (wrong results; timing only)
  nostore    D1 never stored (timing only)
  readonly   consumers only wait and release the ring (timing only); +storezero: and store
             zeros (timing only)
  storehalf  with readonly: and store D1's 16 KB per tile once (timing only); storesmall: the
             same stores into 4096 rows that stay in L2 (timing only)
  wg3p       three consumer warpgroups and a producer warpgroup (512 threads, setmaxnreg 40/152);
             tiles start their mainloops in order (a count in shared memory past the plan's)
  wg3        three consumer warpgroups instead of two (448 threads, __maxnreg__(144))
  storecoal  as storehalf, 512 contiguous bytes per warp instruction; storecs: storehalf's
             pattern through st.global.cs (both timing only)
  tmaonly    with readonly: the copy engine stores each tile's staging as it is, with no
             arithmetic and no staging writes (timing only)
  l2_128, l2_256  the ring's cp.async with an L2 prefetch size of 128 / 256 bytes
  noef       the ring's cp.async without its L2 evict-first policy; eflast: evict-last instead
  tmanohint  the copy engine's stores without their L2 evict-first policy
  stcs       D1 stored through st.global.cs (L2 evict-first)
  tmaef      with tmastore: the tensor stores carry an L2 evict-first policy
  nofence    no fence.proxy.async after the consumers' full waits (timing only)
  lagged     each slot released one k tile later (wgmma_wait<1>), as kgen emitted before
             2026-11-22 (the other figures' `relnow`, now the base)
  onek16     one k16 wgmma per k tile instead of four (timing only)
  noepi0     g0's epilogue without its loads (timing only)
  nog0mma    no wgmma in g0 (timing only)

Since 2026-11-22 kgen emits this example with a ring of 12 slots and D1 through the copy engine
(schedule.tma_output), which is what `ring=12+tmastore+tmaef` prototyped: the edits that rewrite
the 16-byte register stores (nostore, storezero/half/small/coal/cs, stcs, coalesce, bulkstore,
tmastore, tmaef) and the ones sized for 16 slots (ring=N above 12, wg3p's count, split) apply to
the emitted source of before (git 7aec506) and now stop at their anchors, as designed. Since
fb06415 A's ring copies carry no L2 policy (the `noef` edit), so `noef`, `eflast` and `l2_*`
stop at theirs too.

The figures and what they showed are in bench/RESULTS.md; raw logs in bench/logs/variants/.
The runs there predate g1 on wgmma: their `base` ran g1 on mma.sync, and their
`k64+g1wgmma` (g1 tile K 64, then wgmma) is what kgen now emits.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import re
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

EXAMPLE = os.path.join(ROOT, "examples", "b2b_gemm_rf_pingpong_sm90a.kg")
EXTRA_SMEM = 230912  # prototype variants that use shared memory past the plan's
SETS = 3  # input sets rotated past L2 (each is 115 MB at M = 81920)


def edit(source: str, old: str, new: str, count: int = 1) -> str:
    found = source.count(old)
    if found != count:
        raise SystemExit(f"edit expected {count} match(es), found {found}: {old[:80]!r}")
    return source.replace(old, new)


TMA_HELPERS = r"""
struct __align__(64) TensorMapBytes { unsigned long long v[16]; };
extern "C" {
__device__ TensorMapBytes g_a_maps[8];
__device__ const void* g_a_bases[8];
}

__device__ __forceinline__ void mbarrier_expect_bytes(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
"""

BULK_HELPERS = r"""
__device__ __forceinline__ void bulk_store(void* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void warpgroup_barrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
}
"""

def _wgmma_ss_helper() -> str:
    outs = ", ".join(f'"+f"(acc[0][{j // 4}][{j % 4}])' for j in range(64))
    regs = ", ".join(f"%{i}" for i in range(64))
    return (
        "__device__ __forceinline__ void wgmma_ss_128(float (&acc)[1][16][4], unsigned long long a,\n"
        "                                             unsigned long long b) {\n"
        "  asm volatile(\n"
        "      \"wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 \"\n"
        f"      \"{{{regs}}}, %64, %65, 1, 1, 1, 0, 0;\\n\"\n"
        f"      : {outs}\n"
        '      : "l"(a), "l"(b));\n'
        "}\n")


# The split schedule: warpgroup 0 runs g0 (ring -> wgmma -> epilogue) for every tile and hands
# g0's f16 output to warpgroup 1 through two 8 KB shared buffers (slots 14 and 15 of the ring's
# space, 128-byte swizzled like A's slots); warpgroup 1 runs g1 (wgmma, both operands in shared
# memory) and stores D1. Four more mbarriers (after the ring's 2 x 14) pace the hand-off.
SPLIT_CONSUMERS = r"""  const int warpgroup = warp_id / 4;
  const int math_warp = warp_id % 4;
  const unsigned hand = smem_address(smem.g0_a_smem()) + 14 * 8192;
  const unsigned hand_full = full_bar + 8 * 28;
  const unsigned hand_empty = full_bar + 8 * 30;
  if (warpgroup == 0) {
    using namespace g0_cfg;
    const unsigned a_smem = smem_address(smem.g0_a_smem());
    const unsigned b_smem = smem_address(smem.g0_b_smem());
    constexpr unsigned kAStageBytes = ALayout::kStageElems * 2;
    constexpr unsigned kBStageBytes = BLayout::kStageElems * 2;
    constexpr int k_tiles = 9;
    int local = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
      int tile_m, tile_n;
      tile_coords(tile, tiles_m, tiles_n, tile_m, tile_n);
      const int m0 = tile_m * kTileM;
      float acc[1][8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
      int fill = local * k_tiles;
      for (int kt = 0; kt < k_tiles; ++kt, ++fill) {
        const int slot = fill % kStages;
        mbarrier_wait(full_bar + 8 * slot, (fill / kStages) & 1);
        fence_proxy_async();
        const unsigned a_stage = a_smem + slot * kAStageBytes;
        const unsigned b_stage = b_smem + kt * kBStageBytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk)
          wgmma_step(acc, smem_descriptor(a_stage + kk * 16 * 2), smem_descriptor(b_stage + kk * 16 * 2));
        wgmma_commit();
        if (kt > 0) {
          wgmma_wait<1>();
          mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));
        }
      }
      wgmma_wait<0>();
      mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));
      const int buf = local % 2;
      if (local >= 2) mbarrier_wait(hand_empty + 8 * buf, ((local / 2) - 1) & 1);
      const unsigned out = hand + buf * 8192;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int r = math_warp * 16 + lane / 4;
        const int c = j * 8 + (lane % 4) * 2;
        float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
        if (m0 + r < M) g0_epilogue(p, m0 + r, c, acc[0][j][0], acc[0][j][1], x0, x1);
        if (m0 + r + 8 < M) g0_epilogue(p, m0 + r + 8, c, acc[0][j][2], acc[0][j][3], x2, x3);
        const unsigned lo = pack_operands(x0, x1), hi = pack_operands(x2, x3);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(out + ALayout::offset(r, c) * 2), "r"(lo) : "memory");
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(out + ALayout::offset(r + 8, c) * 2), "r"(hi) : "memory");
      }
      fence_proxy_async();  // written by ordinary stores, read by wgmma
      mbarrier_arrive(hand_full + 8 * buf);
    }
  } else {
    using namespace g1_cfg;
    const unsigned b_smem = smem_address(smem.g1_b_smem());
    int local = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
      int tile_m, tile_n;
      tile_coords(tile, tiles_m, tiles_n, tile_m, tile_n);
      const int m0 = tile_m * kTileM;
      const int n0 = tile_n * kTileN;
      const int warp_m = math_warp, warp_n = 0;
      const int buf = local % 2;
      float acc[1][16][4];
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
      mbarrier_wait(hand_full + 8 * buf, (local / 2) & 1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_ss_128(acc, smem_descriptor(hand + buf * 8192 + kk * 32), smem_descriptor(b_smem + kk * 32));
      wgmma_commit();
      wgmma_wait<0>();
      mbarrier_arrive(hand_empty + 8 * buf);
      // Epilogue
      // Thread q"""

TMASTORE_HELPERS = r"""
struct __align__(64) DMapBytes { unsigned long long v[16]; };
extern "C" {
__device__ DMapBytes g_d_maps[8];
__device__ const void* g_d_bases[8];
}
__device__ __forceinline__ void tma_store_2d(const void* map, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               ::"l"(map), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void st_shared_b32(unsigned address, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(v) : "memory");
}
"""

TMASTORE_EPILOGUE = """      // Epilogue: D1 through shared memory (two 64x64 halves, 128-byte swizzle) and the copy engine
      const unsigned stage_s = smem_address(smem.g0_a_smem()) + 12 * 8192 + warpgroup * 16384;
      if (tid % 128 == 0) bulk_wait_read();  // the last tile's stores have read the staging
      warpgroup_barrier(warpgroup);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int r = math_warp * 16 + lane / 4;
        const int c = j * 8 + (lane % 4) * 2;
        const unsigned half = stage_s + (c / 64) * 8192;
        st_shared_b32(half + g0_cfg::ALayout::offset(r, c % 64) * 2,
                      g1_epilogue(p, m0 + r, n0 + c, acc[0][j][0], acc[0][j][1]));
        st_shared_b32(half + g0_cfg::ALayout::offset(r + 8, c % 64) * 2,
                      g1_epilogue(p, m0 + r + 8, n0 + c, acc[0][j][2], acc[0][j][3]));
      }
      fence_proxy_async();
      warpgroup_barrier(warpgroup);
      if (tid % 128 == 0) {
        tma_store_2d(dmap, stage_s, n0, m0);
        tma_store_2d(dmap, stage_s + 8192, n0 + 64, m0);
        bulk_commit();
      }
    }
  }
  if (tid % 128 == 0) bulk_wait_all();
}
"""

PRODUCER_LOOP = """      if (fill >= kStages) mbarrier_wait(empty_bar + 8 * slot, (fill / kStages - 1) & 1);
      __syncwarp();  // lanes leave the wait apart; cp.async with an L2 policy needs the warp whole
      load_a_stage(a_smem + slot * kAStageBytes, p.A, p.ld_A, m0, M, kt * kTileK, K, t);
      cp_async_mbarrier_arrive(full_bar + 8 * slot);"""

PRODUCER_TMA = """      if (fill >= kStages) mbarrier_wait(empty_bar + 8 * slot, (fill / kStages - 1) & 1);
      mbarrier_expect_bytes(full_bar + 8 * slot, kAStageBytes);
      tma_load_2d(a_smem + slot * kAStageBytes, map, kt * kTileK, m0, full_bar + 8 * slot);"""

PRODUCER_KT_LOOP = ("    for (int kt = 0; kt < k_tiles; ++kt, ++fill) {\n      const int slot = fill % kStages;\n"
                    + PRODUCER_LOOP + "\n    }\n")

# batch: the producer waits until all of a tile's k_tiles slots are free, then copies the tile row
# by row (each row's k chunks back to back, so DRAM sees whole rows), then arms the full barriers.
PRODUCER_BATCH = """    for (int kt = 0; kt < k_tiles; ++kt) {
      const int f = fill + kt;
      if (f >= kStages) mbarrier_wait(empty_bar + 8 * (f % kStages), (f / kStages - 1) & 1);
    }
    __syncwarp();
    {
      const int row = t / 8, col = t % 8 * 8;
      const unsigned base = ALayout::offset(row, col) * 2;
#pragma unroll
      for (int g = 0; g < 8; ++g) {
        const int r = m0 + row + 8 * g;
        const __half* from = p.A + (long long)r * p.ld_A + col;
#pragma unroll
        for (int kt = 0; kt < 9; ++kt)
          cp_async_16_evict_first(a_smem + ((fill + kt) % kStages) * kAStageBytes + base + g * 1024,
                                  from + kt * 64, p.A, r < M ? 16 : 0);
      }
    }
    for (int kt = 0; kt < k_tiles; ++kt) cp_async_mbarrier_arrive(full_bar + 8 * ((fill + kt) % kStages));
    fill += k_tiles;
"""

RELEASE_COMMENT = ("        // The slot goes back to the producer as soon as its own group has completed: waiting for this\n"
                   "        // group rather than the one before hands each slot back one k tile earlier, which measured\n"
                   "        // faster on an H200 (bench/RESULTS.md) than keeping two groups in flight.\n")
LOOP_END = "        mbarrier_arrive(empty_bar + 8 * slot);\n      }\n"  # a consumer's k loop ends

STORE = "            if (live) *reinterpret_cast<uint4*>(p.D1 + row * p.ld_D1 + col) = chunk;"


def variant_source(base: str, name: str) -> str:
    src = base
    parts = name.split("+")
    for part in parts:
        if part.startswith("ring="):
            src = edit(src, "constexpr int kStages = 16;", f"constexpr int kStages = {int(part[5:])};")
        elif part == "tma":
            src = edit(src, "// ---- schedule pingpong: the ring's full and empty mbarriers ----",
                       TMA_HELPERS + "\n// ---- schedule pingpong: the ring's full and empty mbarriers ----")
            src = edit(src, "mbarrier_init(full_bar + 8 * s, kProducerThreads);",
                       "mbarrier_init(full_bar + 8 * s, 1);")
            src = edit(src, "  int fill = 0;\n  for (int tile = blockIdx.x;",
                       "  if (t != 0) return;\n  const void* map = &g_a_maps[0];\n"
                       "  for (int i = 1; i < 8; ++i) if (g_a_bases[i] == p.A) map = &g_a_maps[i];\n"
                       "  asm volatile(\"prefetch.tensormap [%0];\" ::\"l\"(map) : \"memory\");\n"
                       "  int fill = 0;\n  for (int tile = blockIdx.x;")
            src = edit(src, PRODUCER_LOOP, PRODUCER_TMA)
            src = edit(src, "  cp_async_commit();  // the warps leave only when their last copies have landed\n"
                            "  cp_async_wait<0>();\n", "")
        elif part == "bulkstore":
            src = edit(src, "// ---- schedule pingpong: the ring's full and empty mbarriers ----",
                       BULK_HELPERS + "\n// ---- schedule pingpong: the ring's full and empty mbarriers ----")
            # staging: 16 KB per warpgroup at the end of the ring's 16 slots (needs ring <= 12)
            src = edit(src, "      // Epilogue\n      // Thread q",
                       "      const unsigned stage_s = smem_address(smem.g0_a_smem()) + 12 * 8192 + warpgroup * 16384;\n"
                       "      unsigned char* stage_g = reinterpret_cast<unsigned char*>(smem.g0_a_smem()) + 12 * 8192 + warpgroup * 16384;\n"
                       "      if (math_warp == 0) bulk_wait_read();  // the last tile's rows have left the staging\n"
                       "      warpgroup_barrier(warpgroup);\n"
                       "      // Epilogue\n      // Thread q")
            src = edit(src, STORE,
                       "            *reinterpret_cast<uint4*>(stage_g + (row - m0) * 256 + col * 2) = chunk;")
            src = edit(src, "          }\n        }\n      }\n    }\n  }\n}\n",
                       "          }\n        }\n      }\n"
                       "      fence_proxy_async();\n      warpgroup_barrier(warpgroup);\n"
                       "      if (math_warp == 0) {\n"
                       "        for (int r = lane; r < 64; r += 32)\n"
                       "          if (m0 + r < M) bulk_store(p.D1 + (m0 + r) * p.ld_D1 + n0, stage_s + r * 256, 256);\n"
                       "        bulk_commit();\n      }\n"
                       "    }\n  }\n  if (math_warp == 0) bulk_wait_all();\n}\n")
        elif part == "batch":
            src = edit(src, PRODUCER_KT_LOOP, PRODUCER_BATCH)
        elif part.startswith("l2pf="):  # one bulk L2 prefetch of the tile `d` rounds ahead
            d = int(part[5:])
            src = edit(src, "    const int m0 = tile_m * kTileM;\n    for (int kt = 0; kt < k_tiles; ++kt",
                       "    const int m0 = tile_m * kTileM;\n"
                       f"    if (t == 0 && tile + {d} * gridDim.x < tiles_m * tiles_n) {{\n"
                       f"      int pm, pn;\n      tile_coords(tile + {d} * gridDim.x, tiles_m, tiles_n, pm, pn);\n"
                       "      const int rows = min(kTileM, M - pm * kTileM);\n"
                       "      asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" ::\"l\"(p.A + (long long)pm * kTileM * p.ld_A),\n"
                       "                   \"r\"((unsigned)(rows * p.ld_A * 2)) : \"memory\");\n"
                       "    }\n"
                       "    for (int kt = 0; kt < k_tiles; ++kt")
        elif part == "contig":  # timing only: each slot reads 8 KB of A that are contiguous
            src = edit(src, "load_a_stage(a_smem + slot * kAStageBytes, p.A, p.ld_A, m0, M, kt * kTileK, K, t);",
                       "load_a_stage(a_smem + slot * kAStageBytes, p.A, 64, (tile_m * 9 + kt) * 64, M * 9, 0, 64, t);")
        elif part == "nostore":
            src = edit(src, STORE, "            if (live && chunk.x == 0x7badbeefu && chunk.y == 0x7badbeefu) "
                                   "*reinterpret_cast<uint4*>(p.D1 + row * p.ld_D1 + col) = chunk;")
        elif part == "readonly":
            src = edit(src, LOOP_END,
                       LOOP_END +
                       "      if (acc[0][0][0] != 12345.0f) continue;\n")
            src = edit(src, "          wgmma_step(acc, smem_descriptor(a_stage + kk * 16 * 2),\n"
                            "                     smem_descriptor(b_stage + kk * 16 * 2));\n",
                       "          (void)a_stage, (void)b_stage;\n")
        elif part == "ldg":
            for v in ("scale0", "bias0"):
                src = edit(src, f"*reinterpret_cast<const float2*>(p.{v} + col)",
                           f"__ldg(reinterpret_cast<const float2*>(p.{v} + col))")
        elif part == "nog0mma":
            src = edit(src, "          wgmma_step(acc, smem_descriptor(a_stage + kk * 16 * 2),\n"
                            "                     smem_descriptor(b_stage + kk * 16 * 2));\n",
                       "          acc[0][kk][0] += __uint_as_float(a_stage ^ b_stage);\n")
        elif part == "split":  # needs ring=14
            start = src.index("  const int warpgroup = warp_id / 4;")
            end = src.index("      // Epilogue\n      // Thread q")
            src = src[:start] + SPLIT_CONSUMERS + src[end + len("      // Epilogue\n      // Thread q"):]
            src = edit(src, "      mbarrier_init(empty_bar + 8 * s, kWarpgroupThreads);  // the consuming warpgroup\n    }\n",
                       "      mbarrier_init(empty_bar + 8 * s, kWarpgroupThreads);  // the consuming warpgroup\n    }\n"
                       "    for (int s = 28; s < 32; ++s) mbarrier_init(full_bar + 8 * s, kWarpgroupThreads);\n")
            src = edit(src, "// ---- schedule pingpong: the ring's full and empty mbarriers ----",
                       _wgmma_ss_helper() + "\n// ---- schedule pingpong: the ring's full and empty mbarriers ----")
        elif part == "noepi0":
            src = edit(src, "if (m0 + r < M) g0_epilogue(p, m0 + r, c, acc[i][j][0], acc[i][j][1], x0, x1);",
                       "x0 = acc[i][j][0]; x1 = acc[i][j][1];")
            src = edit(src, "if (m0 + r + 8 < M) g0_epilogue(p, m0 + r + 8, c, acc[i][j][2], acc[i][j][3], x2, x3);",
                       "x2 = acc[i][j][2]; x3 = acc[i][j][3];")
        elif part == "storezero":  # with readonly: stores zeros for every tile
            src = edit(src, "      if (acc[0][0][0] != 12345.0f) continue;\n",
                       "      if (acc[0][0][0] != 12345.0f) {\n"
                       "        for (int i = 0; i < 16; ++i) {\n"
                       "          const int row = m0 + math_warp * 16 + (i / 8) * 8 + lane / 4;\n"
                       "          const int col = (i % 4) * 32 + (lane % 4) * 8;\n"
                       "          if (row < M) *reinterpret_cast<uint4*>(p.D1 + row * p.ld_D1 + col) = make_uint4(i, 0, 0, 0);\n"
                       "        }\n        continue;\n      }\n")
        elif part in ("storehalf", "storesmall"):  # with readonly: D1's 16 KB per tile, once each
            # (storesmall: into 4096 rows that stay in L2)
            target = ("((row % 64) + blockIdx.x % 64 * 64)" if part == "storesmall" else "row")
            src = edit(src, "      if (acc[0][0][0] != 12345.0f) continue;\n",
                       "      if (acc[0][0][0] != 12345.0f) {\n"
                       "        for (int i = 0; i < 8; ++i) {\n"
                       "          const int row = m0 + math_warp * 16 + (i / 4) * 8 + lane / 4;\n"
                       "          const int col = (i % 4) * 32 + (lane % 4) * 8;\n"
                       f"          if (row < M) *reinterpret_cast<uint4*>(p.D1 + {target} * p.ld_D1 + col) = make_uint4(i, 0, 0, 0);\n"
                       "        }\n        continue;\n      }\n")
        elif part == "wg3":  # three consumer warpgroups take the CTA's tiles in turn (448 threads)
            src = edit(src, "constexpr int kThreads = 320;", "constexpr int kThreads = 448;")
            src = edit(src, "kThreads == 2 * kWarpgroupThreads + kProducerThreads",
                       "kThreads == 3 * kWarpgroupThreads + kProducerThreads")
            src = edit(src, '::"n"(2 * kWarpgroupThreads)', '::"n"(3 * kWarpgroupThreads)')
            src = edit(src, "__launch_bounds__(320, 1)", "__maxnreg__(144)")
            src = edit(src, "if (tid >= 2 * kWarpgroupThreads) {", "if (tid >= 3 * kWarpgroupThreads) {")
            src = edit(src, "tid - 2 * kWarpgroupThreads", "tid - 3 * kWarpgroupThreads")
            src = edit(src, "tile += 2 * gridDim.x, local += 2", "tile += 3 * gridDim.x, local += 3")
        elif part in ("storecoal", "storecs"):  # with readonly: 16 KB per tile, 512 contiguous bytes
            # per warp instruction (storecoal) or storehalf's pattern through st.global.cs (storecs)
            if part == "storecoal":
                row, col, put = ("m0 + math_warp * 16 + i * 2 + lane / 16", "(lane % 16) * 8",
                                 "*reinterpret_cast<uint4*>(p.D1 + row * p.ld_D1 + col) = make_uint4(i, 0, 0, 0)")
            else:
                row, col, put = ("m0 + math_warp * 16 + (i / 4) * 8 + lane / 4", "(i % 4) * 32 + (lane % 4) * 8",
                                 "__stcs(reinterpret_cast<uint4*>(p.D1 + row * p.ld_D1 + col), make_uint4(i, 0, 0, 0))")
            src = edit(src, "      if (acc[0][0][0] != 12345.0f) continue;\n",
                       "      if (acc[0][0][0] != 12345.0f) {\n"
                       "        for (int i = 0; i < 8; ++i) {\n"
                       f"          const int row = {row};\n          const int col = {col};\n"
                       f"          if (row < M) {put};\n"
                       "        }\n        continue;\n      }\n")
        elif part == "stcs":  # D1 stored with st.global.cs (evict-first in L2)
            src = edit(src, STORE, "            if (live) __stcs(reinterpret_cast<uint4*>(p.D1 + row * p.ld_D1 + col), chunk);")
        elif part == "tmaef":  # with tmastore: the copy engine's stores carry an L2 evict-first hint
            src = edit(src, '''  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\\n"
               ::"l"(map), "r"(src), "r"(c0), "r"(c1) : "memory");''',
                       '''  asm volatile("{\\n.reg .b64 policy;\\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\\n"
               "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], policy;\\n}\\n"
               ::"l"(map), "r"(src), "r"(c0), "r"(c1) : "memory");''')
        elif part == "wg3p":  # three consumer warpgroups and a producer warpgroup (512 threads):
            # the producer warpgroup gives registers back (setmaxnreg.dec 40), the consumers take
            # them (setmaxnreg.inc 152); two of the producer warps copy, as before
            src = edit(src, "constexpr int kThreads = 320;", "constexpr int kThreads = 512;")
            src = edit(src, "kThreads == 2 * kWarpgroupThreads + kProducerThreads", "kThreads == 4 * kWarpgroupThreads")
            src = edit(src, '::"n"(2 * kWarpgroupThreads)', '::"n"(3 * kWarpgroupThreads)')
            src = edit(src, "__launch_bounds__(320, 1)", "__launch_bounds__(512, 1)")
            src = edit(src, "  if (tid >= 2 * kWarpgroupThreads) {  // the producers: A streams in while the consumers wait for B\n"
                            "    g0_cfg::produce_ring(p, smem, tiles_m, tiles_n, full_bar, empty_bar, tid - 2 * kWarpgroupThreads);\n"
                            "    return;\n  }\n",
                       "  if (tid >= 3 * kWarpgroupThreads) {\n"
                       "    asm volatile(\"setmaxnreg.dec.sync.aligned.u32 40;\\n\" ::: \"memory\");\n"
                       "    if (tid < 3 * kWarpgroupThreads + kProducerThreads)\n"
                       "      g0_cfg::produce_ring(p, smem, tiles_m, tiles_n, full_bar, empty_bar, tid - 3 * kWarpgroupThreads);\n"
                       "    return;\n  }\n"
                       "  asm volatile(\"setmaxnreg.inc.sync.aligned.u32 152;\\n\" ::: \"memory\");\n")
            src = edit(src, "tile += 2 * gridDim.x, local += 2", "tile += 3 * gridDim.x, local += 3")
            # A warpgroup could now reach a slot two phases early (its first fill of a tile can be
            # kStages + 2 past the last one that landed), and a parity wait would take the phase
            # before for its own. So tiles start in order: a monotonic count in shared memory (past
            # the plan's bytes) of the tiles whose mainloops have finished; tile `local` starts
            # when it reaches `local`, when every earlier fill has landed.
            src = edit(src, "  __syncthreads();  // the barriers are initialized\n",
                       "  volatile int* const started = reinterpret_cast<volatile int*>(smem_raw + 221440);\n"
                       "  if (tid == 0) *started = 0;\n"
                       "  __syncthreads();  // the barriers are initialized\n")
            src = edit(src, "      int fill = local * k_tiles;\n",
                       "      int fill = local * k_tiles;\n"
                       "      while (*started < local) __nanosleep(20);\n")
            src = edit(src, LOOP_END,
                       LOOP_END +
                       "      if (tid % kWarpgroupThreads == 0) *started = local + 1;\n")
        elif part == "nosetmax":  # with wg3p: no setmaxnreg (every warp keeps 128 registers)
            src = edit(src, '    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\\n" ::: "memory");\n', "")
            src = edit(src, '  asm volatile("setmaxnreg.inc.sync.aligned.u32 152;\\n" ::: "memory");\n', "")
        elif part == "nofence":  # no fence.proxy.async after the full waits (timing only)
            src = edit(src, "        fence_proxy_async();  // cp.async wrote the slot through the generic proxy; wgmma reads the async one\n", "")
        elif part == "lagged":  # each slot released one k tile later, after wait<1> (kgen before 2026-11-22)
            src = edit(src, "        wgmma_commit();\n" + RELEASE_COMMENT + "        wgmma_wait<0>();\n"
                            "        mbarrier_arrive(empty_bar + 8 * slot);\n      }\n",
                       "        wgmma_commit();\n        if (kt > 0) {\n          wgmma_wait<1>();\n"
                       "          mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));\n        }\n      }\n"
                       "      wgmma_wait<0>();\n      mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));\n")
        elif part == "onek16":  # one k16 wgmma per k tile instead of four (timing only)
            src = edit(src, "        for (int kk = 0; kk < kTileK / 16; ++kk)  // k16 steps", "        for (int kk = 0; kk < 1; ++kk)  // k16 steps")
        elif part == "tmaonly":  # with readonly: the copy engine stores the staging as it is
            # (no arithmetic, no staging writes; timing only)
            src = edit(src, "      if (acc[0][0][0] != 12345.0f) continue;\n",
                       "      if (acc[0][0][0] != 12345.0f) {\n"
                       "        const unsigned staging = smem_address(smem.g1_d_staging()) + warpgroup * 2 * kStagingBoxBytes;\n"
                       "        if (tid % kWarpgroupThreads == 0) bulk_wait_read();\n"
                       "        warpgroup_barrier(warpgroup);\n"
                       "        if (tid % kWarpgroupThreads == 0) {\n"
                       "          for (int box = 0; box < 2; ++box)\n"
                       "            tma_store_box(&maps.D1, staging + box * kStagingBoxBytes, box * 64, m0);\n"
                       "          bulk_commit();\n"
                       "        }\n        continue;\n      }\n")
        elif part in ("l2_128", "l2_256"):  # the ring's cp.async asks L2 to fetch 128/256 bytes
            src = edit(src, "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, policy;",
                       f"cp.async.cg.shared.global.L2::cache_hint.L2::{part[3:]}B [%0], [%1], 16, %2, policy;")
        elif part == "noef":  # the ring's cp.async without the L2 evict-first policy
            src = edit(src, "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, policy;",
                       "cp.async.cg.shared.global [%0], [%1], 16, %2;")
        elif part == "tmanohint":  # the copy engine's stores without the L2 evict-first policy
            src = edit(src, "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], policy;",
                       "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];")
        elif part == "eflast":  # the ring's cp.async with an L2 evict-last policy instead
            src = edit(src, 'createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\\n"\n      "cp.async.cg',
                       'createpolicy.fractional.L2::evict_last.b64 policy, 1.0;\\n"\n      "cp.async.cg')
        elif part == "trace":
            src = edit(src, "// ---- schedule pingpong: the ring's full and empty mbarriers ----",
                       'extern "C" { __device__ long long g_trace[132 * 2 * 16 * 3]; __device__ long long g_ptrace[132]; }\n'
                       "// ---- schedule pingpong: the ring's full and empty mbarriers ----")
            src = edit(src, "    const int m0 = tile_m * g0_cfg::kTileM;\n",
                       "    const int m0 = tile_m * g0_cfg::kTileM;\n"
                       "    long long* stamp = g_trace + ((blockIdx.x * 2 + warpgroup) * 16 + min(local / 2, 15)) * 3;\n"
                       "    if (tid % 128 == 0) stamp[0] = clock64();\n")
            src = edit(src, LOOP_END,
                       LOOP_END +
                       "      if (tid % 128 == 0) stamp[1] = clock64();\n")
            src = edit(src, "          }\n        }\n      }\n    }\n  }\n}\n",
                       "          }\n        }\n      }\n    }\n    if (tid % 128 == 0) stamp[2] = clock64();\n  }\n}\n")
            src = edit(src, "      if (fill >= kStages) mbarrier_wait(empty_bar + 8 * slot, (fill / kStages - 1) & 1);\n",
                       "      const long long w0 = clock64();\n"
                       "      if (fill >= kStages) mbarrier_wait(empty_bar + 8 * slot, (fill / kStages - 1) & 1);\n"
                       "      if (t == 0) g_ptrace[blockIdx.x] += clock64() - w0;\n")
        elif part == "hoist":  # scale0, bias0 copied to shared memory once (needs EXTRA_SMEM)
            for v, off in (("scale0", 230400), ("bias0", 230656)):
                src = edit(src, f"*reinterpret_cast<const float2*>(p.{v} + col)",
                           f"*reinterpret_cast<const float2*>(smem_extra + {off} + col * 4)")
            src = edit(src, "__device__ __forceinline__ void g0_epilogue(",
                       "extern __shared__ __align__(1024) unsigned char smem_extra[];\n"
                       "__device__ __forceinline__ void g0_epilogue(")
            src = edit(src, "      cp_async_commit();\n    }\n    cp_async_wait<0>();\n",
                       "      cp_async_commit();\n    }\n"
                       "    if (tid < 64) {\n"
                       "      reinterpret_cast<float*>(smem_raw + 230400)[tid] = p.scale0[tid];\n"
                       "      reinterpret_cast<float*>(smem_raw + 230656)[tid] = p.bias0[tid];\n    }\n"
                       "    cp_async_wait<0>();\n")
        elif part == "coalesce":  # D1 through a per-warp 2 KB staging (needs ring=15, EXTRA_SMEM)
            src = edit(src, STORE + "\n          }\n",
                       "            {\n"
                       "              const int g = lane / 4, c = col / 8;\n"
                       "              *reinterpret_cast<uint4*>(stg + g * 256 + ((c ^ g) * 16)) = chunk;\n"
                       "            }\n"
                       "          }\n"
                       "          __syncwarp();\n"
                       "#pragma unroll\n"
                       "          for (int it = 0; it < 4; ++it) {\n"
                       "            const int r = it * 2 + lane / 16, c = lane % 16;\n"
                       "            const uint4 v = *reinterpret_cast<const uint4*>(stg + r * 256 + ((c ^ r) * 16));\n"
                       "            const int grow = m0 + warp_m * kWarpTileM + i * 16 + 8 * h + r;\n"
                       "            if (grow < M) *reinterpret_cast<uint4*>(p.D1 + grow * p.ld_D1 + n0 + c * 8) = v;\n"
                       "          }\n"
                       "          __syncwarp();\n")
            src = edit(src, "  const int warpgroup = warp_id / 4;\n",
                       "  const int warpgroup = warp_id / 4;\n"
                       "  unsigned char* const stg = smem_raw + (warp_id < 4 ? 122880 + warp_id * 2048 : 222208 + (warp_id - 4) * 2048);\n")
        elif part == "tmastore":  # needs ring=12
            src = edit(src, "// ---- schedule pingpong: the ring's full and empty mbarriers ----",
                       BULK_HELPERS + TMASTORE_HELPERS + "\n// ---- schedule pingpong: the ring's full and empty mbarriers ----")
            start = src.index("      // Epilogue\n      // Thread q")
            end = src.index("// ====", start)
            src = src[:start] + TMASTORE_EPILOGUE + "\n" + src[end:]
            src = edit(src, "  const int math_warp = warp_id % 4;\n",
                       "  const int math_warp = warp_id % 4;\n"
                       "  const void* dmap = &g_d_maps[0];\n"
                       "  for (int i = 1; i < 8; ++i) if (g_d_bases[i] == p.D1) dmap = &g_d_maps[i];\n")
        elif part != "base" and not part.startswith(("stages=", "grid=")):
            raise SystemExit(f"unknown edit {part!r}")
    return src


TIMING_ONLY = ("tmaonly", "nofence", "onek16", "storecoal", "storecs", "storehalf", "storesmall", "contig", "nostore", "readonly", "nog0mma", "noepi0")

VARIANTS = [
    "base",
    "base+nostore",
    "base+readonly",
    "base+readonly+storezero",
    "base+trace",
    "noepi0",
    "nog0mma",
    "ldg",
    "ring=15",
    "ring=15+hoist",
    "ring=15+coalesce+hoist",
    "ring=14+split",
    "tma",
    "tma+readonly",
    "ring=12",
    "ring=12+tmastore",
    "ring=12+tmastore+hoist",
    "ring=12+bulkstore",
]


def encode_a_map(driver, a) -> bytes:
    """The tensor map of a row-major f16 matrix (A or D1): box 64 x 64, 128-byte swizzle."""
    from kgen.runtime.device import check

    cu = driver
    u32, u64 = cu.cuuint32_t, cu.cuuint64_t
    tmap = check(cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, u32(2), a.data_ptr(),
        [u64(a.shape[1]), u64(a.shape[0])], [u64(a.stride(0) * 2)], [u32(64), u32(64)], [u32(1), u32(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), 128)


def set_maps(driver, kernel, sets, operand="A", prefix=b"g_a") -> None:
    from kgen.runtime.device import check

    lib = check(driver.cuKernelGetLibrary(kernel._kernel.handle), "cuKernelGetLibrary")
    maps_ptr, _ = check(driver.cuLibraryGetGlobal(lib, prefix + b"_maps"), "cuLibraryGetGlobal")
    bases_ptr, _ = check(driver.cuLibraryGetGlobal(lib, prefix + b"_bases"), "cuLibraryGetGlobal")
    maps = b"".join(encode_a_map(driver, s[operand]) for s in sets)
    maps += bytes(128 * (8 - len(sets)))
    bases = b"".join(s[operand].data_ptr().to_bytes(8, "little") for s in sets) + bytes(8 * (8 - len(sets)))
    check(driver.cuMemcpyHtoD(maps_ptr, maps, len(maps)), "cuMemcpyHtoD")
    check(driver.cuMemcpyHtoD(bases_ptr, bases, len(bases)), "cuMemcpyHtoD")


def report_trace(driver, kernel, launch) -> None:
    """One more launch with the trace buffers zeroed: per-warpgroup tile phases, in cycles."""
    import numpy as np
    import torch

    from kgen.runtime.device import check

    lib = check(driver.cuKernelGetLibrary(kernel._kernel.handle), "cuKernelGetLibrary")
    tr, tr_n = check(driver.cuLibraryGetGlobal(lib, b"g_trace"), "cuLibraryGetGlobal")
    pt, pt_n = check(driver.cuLibraryGetGlobal(lib, b"g_ptrace"), "cuLibraryGetGlobal")
    check(driver.cuMemsetD8(tr, 0, tr_n), "cuMemsetD8")
    check(driver.cuMemsetD8(pt, 0, pt_n), "cuMemsetD8")
    torch.cuda.synchronize()
    launch()
    torch.cuda.synchronize()
    a = np.zeros(tr_n // 8, dtype=np.int64)
    b = np.zeros(pt_n // 8, dtype=np.int64)
    check(driver.cuMemcpyDtoH(a, tr, tr_n), "cuMemcpyDtoH")
    check(driver.cuMemcpyDtoH(b, pt, pt_n), "cuMemcpyDtoH")
    a = a.reshape(132, 2, 16, 3)
    done = a[:, :, :, 0] > 0
    main = (a[:, :, :, 1] - a[:, :, :, 0])[done] / 1980.0
    post = (a[:, :, :, 2] - a[:, :, :, 1])[done] / 1980.0
    gap = (a[:, :, 1:, 0] - a[:, :, :-1, 2])[done[:, :, 1:]] / 1980.0
    first = a[:, :, 0, 0]
    last = np.where(done, a[:, :, :, 2], 0).max(axis=2)
    span = (last.max(axis=1) - first.min(axis=1)) / 1980.0
    print(f"  trace (us): mainloop mean {main.mean():.3f} (p10 {np.percentile(main, 10):.3f} p90 "
          f"{np.percentile(main, 90):.3f}); post mean {post.mean():.3f}; gap between a warpgroup's "
          f"tiles {gap.mean():.3f}; CTA span mean {span.mean():.2f} max {span.max():.2f}; "
          f"tiles/WG max {done.sum(axis=2).max()}; producer wait on empty per CTA mean "
          f"{b.mean() / 1980.0:.2f} us", flush=True)


def make_sets(m: int, count: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for _ in range(count):
        out.append(dict(
            A=torch.randn(m, 576, device="cuda", generator=g).half(),
            B0=(torch.randn(64, 576, device="cuda", generator=g) / 24).half().t(),
            B1=(torch.randn(128, 64, device="cuda", generator=g) / 8).half().t(),
            scale0=torch.rand(64, device="cuda", generator=g) + 0.5,
            bias0=torch.randn(64, device="cuda", generator=g) * 0.1,
            D1=torch.full((m, 128), float("nan"), device="cuda", dtype=torch.half)))
    return out


def reference(s):
    import torch

    g0 = torch.relu(s["A"].float() @ s["B0"].float() * s["scale0"] + s["bias0"]).half().float()
    return torch.relu(g0 @ s["B1"].float())


def main() -> None:
    import torch
    from cuda.bindings import driver

    from b2b_bench import copy_bandwidth, copy_ms, time_ms, torch_chain_ms
    from kgen.api import build_file, compile_source
    from kgen.runtime.launch import CompiledKernel
    from kgen.plan import WarpRole

    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=81920)
    ap.add_argument("--check-m", default="81920,1000")
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    built = build_file(EXAMPLE, "sm_90a")
    bw = copy_bandwidth()
    floor_bytes = (args.m * 576 + args.m * 128) * 2
    floor_ms = floor_bytes / bw
    print(f"copy {bw / 1e9:.3f} TB/s; floor {floor_ms:.4f} ms; same-size copy "
          f"{copy_ms(floor_bytes):.4f} ms; PyTorch chain {torch_chain_ms():.4f} ms", flush=True)
    ref_sets = make_sets(args.m, SETS)
    j = [0]

    def read_all():  # A read once (a full reduction)
        ref_sets[j[0] % SETS]["A"].sum(dtype=torch.float32)
        j[0] += 1

    def read_write():  # 512 of A's 576 columns read, D1's bytes written
        s = ref_sets[j[0] % SETS]
        torch.sum(s["A"][:, :512].unflatten(1, (128, 4)), -1, out=s["D1"])
        j[0] += 1

    print(f"torch: A.sum() {time_ms(read_all):.4f} ms; A[:, :512] summed by 4 into D1 "
          f"{time_ms(read_write):.4f} ms", flush=True)
    del ref_sets
    names = args.only.split(",") if args.only else VARIANTS
    rows = []
    sets = make_sets(args.m, SETS)
    checks = {int(m): make_sets(int(m), 1)[0] for m in args.check_m.split(",")}
    for name in names:
        b = built
        stages = [part for part in name.split("+") if part.startswith("stages=")]
        if stages:  # the example itself with another ring depth, placed by the planner
            tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), "pingpong_stages.kg")
            with open(EXAMPLE) as f:
                text = f.read()
            with open(tmp, "w") as f:
                ring = re.search(r"warps 4x1  stages \d+", text).group(0)  # g0's ring
                f.write(edit(text, ring, "warps 4x1  " + stages[0].replace("=", " ")))
            b = build_file(tmp, "sm_90a")
        src = variant_source(b.source, name)
        res = compile_source(src, b.plan.name, "sm_90a")
        plan_class = type(b.plan)
        saved = plan_class.smem_bytes
        if "hoist" in name or "coalesce" in name or "wg3p" in name:
            plan_class.smem_bytes = property(lambda self: EXTRA_SMEM)
        parts = name.split("+")
        threads = 448 if "wg3" in parts else 512 if "wg3p" in parts else b.plan.schedule.threads
        extra = (threads - b.plan.schedule.threads) // 32  # the schedule's warp roles
        roles = b.plan.schedule.warp_roles + ((WarpRole("variant", extra),) if extra else ())
        plan = dataclasses.replace(b.plan, schedule=dataclasses.replace(b.plan.schedule,
                                                                        warp_roles=roles))
        k = CompiledKernel(plan, res.cubin, source=src, compiled=res)
        grids = [part for part in name.split("+") if part.startswith("grid=")]
        if grids:  # the persistent grid's CTA count (the runtime's choice: SMs x CTAs per SM)
            k.persistent_ctas = int(grids[0][5:])
        if "tma" in name.split("+"):
            set_maps(driver, k, sets + list(checks.values()))
        if "tmastore" in name:
            set_maps(driver, k, sets + list(checks.values()), "D1", b"g_d")
        timing_only = any(t in name for t in TIMING_ONLY)
        errors = {}
        if not timing_only:
            for m, s in checks.items():
                s["D1"].fill_(float("nan"))
                k(stream=torch.cuda.current_stream().cuda_stream, **s)
                torch.cuda.synchronize()
                ref = reference(s)
                out = s["D1"].float()
                bad = torch.isnan(out).sum().item()
                rel = ((out - ref).norm() / ref.norm()).item()
                errors[m] = (rel, bad)
        bound = [k.bind(**s) for s in sets]
        i = [0]
        stream = torch.cuda.current_stream().cuda_stream

        def launch():
            k.launch(bound[i[0] % SETS], stream)
            i[0] += 1

        ms = time_ms(launch, iters=50, warmup=10)
        if "trace" in name:
            report_trace(driver, k, launch)
        ok = all(rel < 5e-3 and bad == 0 for rel, bad in errors.values())
        plan_class.smem_bytes = saved
        rows.append(dict(variant=name, ms=ms, regs=res.registers, spills=res.spill_stores,
                         checked=not timing_only, ok=ok if not timing_only else None,
                         errors={str(m): v for m, v in errors.items()}))
        print(f"{name:<28} {ms:8.4f} ms {ms / floor_ms:6.3f}x floor  regs {res.registers} spills {res.spill_stores}  "
              + ("timing only" if timing_only else
                 ("ok " if ok else "FAIL ") + " ".join(f"M={m}: rel {r:.1e} nan {b}" for m, (r, b) in errors.items())),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
