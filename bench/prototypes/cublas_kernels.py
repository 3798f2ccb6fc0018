"""Which kernels torch.matmul (cuBLAS) runs at the bare GEMM sweep's shapes (issue 17), f16: their
names (tile shape, cluster, split-K or stream-K as cuBLAS encodes them) and times, from
torch.profiler. A diagnostic for the wave model: what the library picks where kgen's choice
trails it.

    bash .gpu/device-run.sh python3 bench/prototypes/cublas_kernels.py [--misaligned]

--misaligned: shapes whose K is 8 more than a multiple of 16 (rows 16- but not 32-byte
multiples), where kgen's copy engine path runs at 0.44-0.64x, and their aligned neighbours.
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 512), (6144, 5120, 3072),
          (4096, 11008, 4096), (4096, 4096, 11008), (2048, 2048, 2048), (1024, 1024, 1024),
          (16384, 1024, 1024), (3000, 5000, 2000), (512, 8192, 8192), (128, 4096, 4096),
          (2560, 7168, 4096), (96, 12288, 4096), (1536, 1536, 6144), (256, 2048, 16384)]
if "--misaligned" in sys.argv:
    SHAPES = [(5000, 3000, 1000), (5000, 3000, 1024), (2000, 7000, 3000), (2000, 7000, 3008),
              (4000, 6600, 1500)]
print("device", torch.cuda.get_device_name(0), "torch", torch.__version__)
for m, n, k in SHAPES:
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16).t()  # column-major B, as kgen's
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels.setdefault(e.name, []).append(e.device_time)
    print(f"{m}x{n}x{k}:")
    for name, ts in kernels.items():
        ts = sorted(ts)
        print(f"    {len(ts)}x {ts[len(ts) // 2]:8.1f} us  {name[:200]}")
