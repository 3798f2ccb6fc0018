"""Prototype for issue 15: a Hopper GEMM mainloop (TMA loads into a ring of stages guarded by
full/empty mbarriers, one producer warpgroup, two consumer warpgroups on wgmma from shared-memory
descriptors, setmaxnreg) with the existing pair-wise epilogue, measured beside torch.matmul.

It is an experiment, not kgen's product: the CUDA source is written here directly, with the
knobs as Python values (tile N, stages, persistence), so that the next session can move what
works into templates/sm90/ behind the plan's Schedule. Run on the GPU machine:

    bash .gpu/device-run.sh python3 bench/prototypes/sm90_gemm.py [--quick]

Checks every variant against a float32 PyTorch reference on fresh random inputs (outputs
poisoned with NaN first) at aligned and ragged sizes, then times them with CUDA events (median,
inputs rotated) next to torch.matmul and the unfused PyTorch epilogue.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TILE_M, TILE_K = 128, 64
WARPGROUP = 128


@dataclass(frozen=True)
class Variant:
    tile_n: int = 256
    stages: int = 4
    persistent: bool = False  # CTAs loop over tiles; the producer runs ahead into the next tile
    fused: bool = False  # D = relu(acc + bias[col]) instead of D = acc
    # two consumer warpgroups on alternate tiles (each a whole 128-row tile, its mainloop
    # ordered after the other's), so one stores while the other multiplies; implies persistent
    pingpong: bool = False
    # the output leaves through the copy engine: each consumer writes its rows into a swizzled
    # staging buffer of its own and one thread issues bulk tensor stores, which drain while the
    # consumer goes on to its next tile's mainloop
    tma_store: bool = False

    @property
    def consumer_rows(self) -> int:
        return 128 if self.pingpong else 64

    @property
    def staging_bytes(self) -> int:
        return 2 * self.consumer_rows * self.tile_n * 2 if self.tma_store else 0

    @property
    def name(self) -> str:
        kind = " pingpong" if self.pingpong else " persistent" if self.persistent else ""
        kind += " tma-store" if self.tma_store else ""
        return (f"128x{self.tile_n}x64 s{self.stages}{kind}"
                f"{' +bias,relu' if self.fused else ''}")

    @property
    def stage_bytes(self) -> int:
        return (TILE_M + self.tile_n) * TILE_K * 2

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + self.staging_bytes + 2 * self.stages * 8 + 16


def _wgmma_asm(n: int) -> str:
    """acc[n/8][4] += A(64x16, smem desc) * B(16xn, smem desc), bf16 -> f32, both K-major."""
    regs = ", ".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(acc[{j}][{e}])' for j in range(n // 8) for e in range(4))
    return f"""
__device__ __forceinline__ void wgmma_m64n{n}(float (&acc)[{n // 8}][4], unsigned long long a,
                                             unsigned long long b) {{
  asm volatile(
      "{{\\n.reg .pred d;\\nsetp.ne.b32 d, %{n // 2 + 2}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "
      "{{{regs}}}, %{n // 2}, %{n // 2 + 1}, d, 1, 1, 0, 0;\\n}}\\n"
      : {outs}
      : "l"(a), "l"(b), "r"(1));
}}
"""


def source(v: Variant) -> str:
    n = v.tile_n
    epilogue = ("fmaxf(acc[hm][j][e] + p.bias[col + (e & 1)], 0.0f)" if v.fused
                else "acc[hm][j][e]")
    # staged: columns past N read no bias (the copy engine clips them)
    epilogue_staged = ("fmaxf(acc[hm][j][e] + (col + (e & 1) < p.N ? p.bias[col + (e & 1)] : 0.0f), 0.0f)"
                       if v.fused else "acc[hm][j][e]")
    return r"""
#include <cuda_bf16.h>

// The copy engine's view of a matrix: 128 opaque bytes the launcher encodes.
struct alignas(64) TensorMap {
  unsigned char bytes[128];
};

constexpr int kTileM = 128, kTileN = %(n)d, kTileK = 64, kStages = %(stages)d;
constexpr int kThreads = 3 * 128;
constexpr int kABytes = kTileM * kTileK * 2;
constexpr int kStageBytes = (kTileM + kTileN) * kTileK * 2;
constexpr bool kTmaStore = %(tma_store)s;
constexpr int kStaging = kStages * kStageBytes;  // per consumer: its rows x kTileN, 64-column boxes
constexpr int kStagingBytes = kTmaStore ? (%(pingpong)s ? 128 : 64) * kTileN * 2 : 0;
constexpr int kBarriers = kStaging + 2 * kStagingBytes;  // full[kStages], empty[kStages], turn[2]
constexpr int kGroupM = 8;
constexpr bool kPingpong = %(pingpong)s;
constexpr bool kPersistent = %(persistent)s || kPingpong;
constexpr int kRowsPerConsumer = kPingpong ? 128 : 64;  // a whole tile, or half of one
constexpr int kHalves = kRowsPerConsumer / 64;  // m64 wgmmas per k16 step

struct Params {
  __nv_bfloat16* D;
  const float* bias;
  int M, N, K;
  long long ld_D;
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%%0], %%1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%%1], %%2;\n"
        "selp.u32 %%0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap* map, unsigned bar,
                                         int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%%0], [%%1, {%%3, %%4}], [%%2];\n"
      ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(inner),
        "r"(outer) : "memory");
}
__device__ __forceinline__ void tma_store_box(const TensorMap* map, unsigned src, int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%%0, {%%2, %%3}], [%%1];\n"
      ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(inner), "r"(outer) : "memory");
}
__device__ __forceinline__ void st_shared_u32(unsigned address, unsigned value) {
  asm volatile("st.shared.u32 [%%0], %%1;\n" ::"r"(address), "r"(value) : "memory");
}
__device__ __forceinline__ unsigned long long descriptor(unsigned address) {
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) | (1ull << 16) |
         (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %%0;\n" ::"n"(kPending) : "memory");
}
%(wgmma)s

__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = kGroupM * tiles_n;
  const int group = tile / per_group;
  const int first_m = group * kGroupM;
  const int rows = min(tiles_m - first_m, kGroupM);
  tm = first_m + (tile %% per_group) %% rows;
  tn = (tile %% per_group) / rows;
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
proto_gemm(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b,
           const __grid_constant__ TensorMap map_d, const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned base = smem_u32(smem);
  const unsigned full = base + kBarriers, empty = full + 8 * kStages, turn = empty + 8 * kStages;
  const int warpgroup = threadIdx.x / 128;
  const int tiles_m = (p.M + kTileM - 1) / kTileM, tiles_n = (p.N + kTileN - 1) / kTileN;
  const int tiles = tiles_m * tiles_n;
  const int k_tiles = (p.K + kTileK - 1) / kTileK;
  const int first = blockIdx.x, step = kPersistent ? gridDim.x : tiles;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full + 8 * s, 1);
      mbarrier_init(empty + 8 * s, kPingpong ? 1 : 2);
    }
    mbarrier_init(turn, 1);  // ping-pong: consumer 0 may run its mainloop
    mbarrier_init(turn + 8, 1);  // ... consumer 1 may
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {  // the producer: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      int it = 0;  // the ring position over every tile of this CTA
      for (int tile = first; tile < tiles; tile += step) {
        int tm, tn;
        tile_coords(tile, tiles_m, tiles_n, tm, tn);
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it %% kStages, round = it / kStages;
          if (round > 0) mbarrier_wait(empty + 8 * s, (round - 1) & 1);
          const unsigned stage = base + s * kStageBytes;
          mbarrier_expect_tx(full + 8 * s, kStageBytes);
          tma_load(stage, &map_a, full + 8 * s, kt * kTileK, tm * kTileM);
          tma_load(stage + kABytes, &map_b, full + 8 * s, kt * kTileK, tn * kTileN);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int consumer = warpgroup - 1;
  const int warp = (threadIdx.x / 32) %% 4, lane = threadIdx.x %% 32;
  // cooperative: both consumers on every tile, rows [64 c, 64 c + 64); ping-pong: consumer c
  // takes the CTA's local tiles c, c + 2, ... whole, and skips the other's ring positions
  const int tile_step = kPingpong ? 2 * step : step;
  int it = kPingpong ? consumer * k_tiles : 0;
  int turns = 0;
  for (int tile = first + (kPingpong ? consumer * step : 0); tile < tiles; tile += tile_step) {
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    float acc[kHalves][kTileN / 8][4];
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int j = 0; j < kTileN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][j][e] = 0.0f;
    if (kPingpong) {  // this consumer's mainloop starts once the other's has issued its last
      mbarrier_wait(turn + 8 * consumer, (turns & 1) ^ (consumer == 0 ? 1 : 0));
      ++turns;
    }
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it %% kStages;
      mbarrier_wait(full + 8 * s, (it / kStages) & 1);
      const unsigned a = base + s * kStageBytes + (kPingpong ? 0 : consumer * 64 * 128);
      const unsigned b = base + s * kStageBytes + kABytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int h = 0; h < kHalves; ++h)
          wgmma_m64n%(n)d(acc[h], descriptor(a + h * 64 * 128 + 32 * kk), descriptor(b + 32 * kk));
      wgmma_commit();
      wgmma_wait<1>();  // the group before this one is done: its stage can be refilled
      if (kt > 0 && threadIdx.x %% 128 == 0) mbarrier_arrive(empty + 8 * ((it - 1) %% kStages));
    }
    if (kPingpong && threadIdx.x %% 128 == 0) mbarrier_arrive(turn + 8 * (1 - consumer));
    wgmma_wait<0>();
    if (k_tiles > 0 && threadIdx.x %% 128 == 0) mbarrier_arrive(empty + 8 * ((it - 1) %% kStages));
    if (kPingpong) it += k_tiles;  // the other consumer's tile
    if (kTmaStore) {
      // the staging buffer is free once the copy engine has read the last tile's stores
      const unsigned staging = base + kStaging + consumer * kStagingBytes;
      if (threadIdx.x %% 128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
      asm volatile("bar.sync %%0, 128;\n" ::"r"(1 + consumer) : "memory");
#pragma unroll
      for (int hm = 0; hm < kHalves; ++hm) {
#pragma unroll
        for (int j = 0; j < kTileN / 8; ++j) {
          const int col = tn * kTileN + j * 8 + (lane %% 4) * 2;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = hm * 64 + warp * 16 + lane / 4 + 8 * h;  // row within this staging
            float v[2];
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const int e = 2 * h + q;
              v[q] = %(epilogue_staged)s;
            }
            const __nv_bfloat162 pair = __floats2bfloat162_rn(v[0], v[1]);
            // box j / 8 of 64 columns, rows of 128 bytes, 16-byte chunks XOR-swizzled by row
            const unsigned chunk = (j %% 8) ^ (r %% 8);
            st_shared_u32(staging + (j / 8) * kRowsPerConsumer * 128 + r * 128 + chunk * 16 + (lane %% 4) * 4,
                          *reinterpret_cast<const unsigned*>(&pair));
          }
        }
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      asm volatile("bar.sync %%0, 128;\n" ::"r"(1 + consumer) : "memory");
      if (threadIdx.x %% 128 == 0) {
        const int row = tm * kTileM + (kPingpong ? 0 : consumer * 64);
#pragma unroll
        for (int box = 0; box < kTileN / 64; ++box)
          tma_store_box(&map_d, staging + box * kRowsPerConsumer * 128, tn * kTileN + box * 64, row);
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
      continue;
    }
#pragma unroll
    for (int hm = 0; hm < kHalves; ++hm) {
      const int row0 = tm * kTileM + (kPingpong ? hm * 64 : consumer * 64) + warp * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < kTileN / 8; ++j) {
        const int col = tn * kTileN + j * 8 + (lane %% 4) * 2;
        if (col >= p.N) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + 8 * h;
          if (row >= p.M) continue;
          float v[2];
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int e = 2 * h + q;
            v[q] = %(epilogue)s;
          }
          *reinterpret_cast<__nv_bfloat162*>(p.D + row * p.ld_D + col) = __floats2bfloat162_rn(v[0], v[1]);
        }
      }
    }
  }
  if (kTmaStore && threadIdx.x %% 128 == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
""" % dict(n=n, stages=v.stages, persistent="true" if v.persistent else "false",
           wgmma=_wgmma_asm(n), epilogue=epilogue, pingpong="true" if v.pingpong else "false",
           tma_store="true" if v.tma_store else "false", epilogue_staged=epilogue_staged)


class Kernel:
    def __init__(self, v: Variant):
        from cuda.bindings import driver as cu

        from kgen.api import compile_source

        self.v = v
        result = compile_source(source(v), "proto_gemm", "sm_90a")
        self.compiled = result
        self.module = _check(cu.cuModuleLoadData(result.cubin))
        self.function = _check(cu.cuModuleGetFunction(self.module, b"proto_gemm"))
        _check(cu.cuFuncSetAttribute(
            self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            v.smem_bytes))
        self.sms = _check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0))
        self.maps: dict = {}

    def _map(self, tensor, box_rows: int):
        """A K-major bf16 operand [rows, K] (row stride tensor.stride(0)) in boxes of
        64 (K) x box_rows with the 128-byte swizzle."""
        from cuda.bindings import driver as cu

        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(0), box_rows)
        if key not in self.maps:
            rows, k = tensor.shape
            u32, u64 = cu.cuuint32_t, cu.cuuint64_t
            m = _check(cu.cuTensorMapEncodeTiled(
                cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, u32(2), tensor.data_ptr(),
                [u64(k), u64(rows)], [u64(tensor.stride(0) * 2)], [u32(64), u32(box_rows)],
                [u32(1), u32(1)], cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
            self.maps[key] = (ctypes.c_ubyte * 128).from_buffer_copy(
                ctypes.string_at(m.getPtr(), 128))
        return self.maps[key]

    def __call__(self, a, bt, d, bias, stream: int):
        """D[M, N] = A[M, K] @ B[K, N] with B given as bt = B^T, [N, K] contiguous."""
        from cuda.bindings import driver as cu

        M, K = a.shape
        N = bt.shape[0]

        class Params(ctypes.Structure):
            _fields_ = [("D", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("M", ctypes.c_int),
                        ("N", ctypes.c_int), ("K", ctypes.c_int), ("ld_D", ctypes.c_longlong)]

        params = Params(d.data_ptr(), bias.data_ptr(), M, N, K, d.stride(0))
        map_a, map_b = self._map(a, TILE_M), self._map(bt, self.v.tile_n)
        map_d = self._map(d, self.v.consumer_rows) if self.v.tma_store else map_a
        args = (ctypes.c_void_p * 4)(ctypes.addressof(map_a), ctypes.addressof(map_b),
                                     ctypes.addressof(map_d), ctypes.addressof(params))
        tiles = -(-M // TILE_M) * -(-N // self.v.tile_n)
        grid = min(tiles, self.sms) if self.v.persistent or self.v.pingpong else tiles
        if grid == 0:
            return
        _check(cu.cuLaunchKernel(self.function, grid, 1, 1, 3 * WARPGROUP, 1, 1,
                                 self.v.smem_bytes, cu.CUstream(stream),
                                 ctypes.addressof(args), 0))


def _check(result):
    from cuda.bindings import driver as cu

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) or None)


def inputs(torch, m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    bt = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    bias = torch.randn(n, device="cuda", generator=g)
    return a, bt, bias


def check(torch, kernel, m, n, k, seed) -> float:
    a, bt, bias = inputs(torch, m, n, k, seed)
    # rows 16-byte aligned, as the copy engine needs (a narrower N is a view of a wider row)
    d = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda", dtype=torch.bfloat16)[:, :n]
    kernel(a, bt, d, bias, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    ref = a.float() @ bt.float().t()
    if kernel.v.fused:
        ref = torch.relu(ref + bias)
    if not torch.isfinite(d.float()).all():
        return float("inf")
    return float((d.float() - ref).norm() / max(float(ref.norm()), 1e-30))


def time_ms(torch, fn, sets, iters=40, warmup=8) -> float:
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(*sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def main() -> int:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--checks-only", action="store_true")
    opts = parser.parse_args()
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__)
    torch.empty(1, device="cuda")  # makes the primary context current for the driver calls
    variants = [Variant(256, 4), Variant(256, 3, persistent=True, tma_store=True),
                Variant(128, 6, pingpong=True), Variant(128, 5, pingpong=True, tma_store=True),
                Variant(256, 3, persistent=True, tma_store=True, fused=True),
                Variant(128, 5, pingpong=True, tma_store=True, fused=True)]
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 512)]
    ragged = [(1, 2, 8), (4097, 4094, 1000), (1000, 520, 72), (130, 258, 8)]
    if opts.quick:
        variants, shapes = variants[:2], shapes[:1]
    if opts.checks_only:  # under compute-sanitizer: small ragged shapes, no timing
        ragged, shapes = [(1, 2, 8), (300, 258, 136), (130, 520, 72)], []
    rows = []
    kernels = []
    for v in variants:
        try:
            kern = Kernel(v)
        except Exception as err:  # a compile or load failure is a result too
            print(f"{v.name}: {err}")
            continue
        c = kern.compiled
        errs = [check(torch, kern, *s, seed=i) for i, s in enumerate(ragged + shapes[:1])]
        ok = all(e < 2e-2 for e in errs)
        print(f"{v.name}: regs {c.registers} spills {c.spill_stores}/{c.spill_loads} "
              f"smem {v.smem_bytes}; rel errors {', '.join(f'{e:.1e}' for e in errs)} "
              f"{'PASS' if ok else 'FAIL'}")
        kernels.append((kern, ok))
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    for m, n, k in shapes:
        sets = []
        for seed in range(2):
            a, bt, bias = inputs(torch, m, n, k, seed + 10)
            sets.append((a, bt, bias, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
        flops = 2 * m * n * k
        t_mm = time_ms(torch, lambda a, bt, bias, d: torch.matmul(a, bt.t(), out=d), sets)
        t_unfused = time_ms(torch, lambda a, bt, bias, d: torch.relu(torch.matmul(a, bt.t()) + bias),
                            sets)
        print(f"\n{m}x{n}x{k}: torch.matmul {t_mm:.4f} ms ({flops / t_mm / 1e9:.0f} TFLOP/s); "
              f"unfused matmul+bias+relu {t_unfused:.4f} ms")
        for kern, ok in kernels:
            t = time_ms(torch, lambda a, bt, bias, d: kern(a, bt, d, bias, stream()), sets)
            base = t_unfused if kern.v.fused else t_mm
            print(f"  {kern.v.name:40s} {t:.4f} ms {flops / t / 1e9:5.0f} TFLOP/s "
                  f"{base / t:.2f}x {'unfused' if kern.v.fused else 'matmul'}"
                  f"{'' if ok else '  (FAILED its check)'}")
            rows.append(dict(variant=kern.v.name, shape=[m, n, k], ms=t, torch_mm_ms=t_mm,
                             torch_unfused_ms=t_unfused, ok=ok))
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
