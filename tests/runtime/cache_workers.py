"""Worker processes for the cache concurrency tests (importable, so `spawn` can start them)."""
from __future__ import annotations

import hashlib
import os
import warnings

SOURCE = r"""
struct add_params { float* y; const float* x; int n; };
extern "C" __global__ void __launch_bounds__(64, 1) add(const __grid_constant__ add_params p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.y[i] += p.x[i];
}
"""


def compile_worker(root, queue):
    os.environ["KGEN_CACHE_DIR"] = root
    try:
        from kgen.runtime.nvrtc import compile_cubin

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a cache warning would be a failure here
            result = compile_cubin(SOURCE, "add", "sm_80")
        queue.put(("ok", hashlib.sha256(result.cubin).hexdigest()))
    except BaseException as err:  # report, never hang the parent
        queue.put(("error", repr(err)))


def store_load_worker(root, key, payload, rounds, queue):
    try:
        from kgen.runtime.cache import CompileCache

        cache = CompileCache(root, enabled=True)
        seen = 0
        for _ in range(rounds):
            cache.store(key, payload, {"log": "x" * 1000})
            entry = cache.load(key)
            if entry is not None:
                if entry.cubin != payload:
                    raise AssertionError("a torn entry was returned")
                seen += 1
        queue.put(("ok", seen))
    except BaseException as err:
        queue.put(("error", repr(err)))
