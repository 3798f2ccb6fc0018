"""Timing `kgen tune`'s candidates on the present GPU with kgen run's harness: one set of random
inputs (kgen/harness/inputs.py) and its copies rotated past L2, shared by every candidate (they
take the same arguments), each candidate's CUDA-event median (harness.run.time_compiled), and
the winner's check against the NumPy reference with poisoned outputs (harness.run.run, as
`kgen run` checks).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import ir
from ..harness.arrays import BufferArrays, TorchArrays, sync, torch_usable
from ..harness.inputs import make_inputs, pick_scalars, resolve_sizes, shape_of
from ..harness.run import rotated_sets, run, time_compiled, work
from ..harness.timing import DEFAULT_WARMUP, Timing
from ..runtime.device import activate, current_device_id, device_info, require_gpu
from .compile import Compiled
from .space import Candidate


class GpuBench:
    """The inputs of one tune on the present GPU, and what it does with a candidate: load,
    time, check."""

    def __init__(self, kernel: ir.Kernel, sizes: Mapping[str, int] | None, *, seed: int = 0,
                 scalars: Mapping[str, float] | None = None, warmup: int = DEFAULT_WARMUP):
        require_gpu("kgen tune")
        self.device_id = current_device_id()
        activate(self.device_id)
        self.info = device_info(self.device_id)
        self.kernel = kernel
        self.seed = seed
        self.warmup = warmup
        self.dims = resolve_sizes(kernel, sizes)
        rng = np.random.default_rng(seed)
        self.scalars = pick_scalars(kernel, scalars, rng)
        self.flops, self.bytes = work(kernel, self.dims)
        self.arrays = TorchArrays(self.device_id) if torch_usable() \
            else BufferArrays(self.device_id)
        params = {p.name: p for p in kernel.params}
        first: dict[str, Any] = {name: self.arrays.upload(array, params[name])
                                 for name, array in make_inputs(kernel, self.dims, rng).items()}
        for param in kernel.params:
            if param.role is ir.Role.OUT:
                first[param.name] = self.arrays.empty(shape_of(param, self.dims), param)
        self.stream = self.arrays.stream()
        self.sets = rotated_sets(self.arrays, first, self.bytes, self.info.l2_bytes)

    @property
    def device_name(self) -> str:
        return self.info.name

    @property
    def compile_arch(self) -> str:
        return self.info.arch

    def load(self, candidate: Candidate, compiled: Compiled):
        from ..runtime.launch import CompiledKernel

        # the tuner compiles the fast entry point alone (compile.Job.narrow_kernel)
        return CompiledKernel(candidate.plan, compiled.cubin, source=candidate.source,
                              device_id=self.device_id,
                              narrow_compiled=candidate.plan.narrow_kernel is None)

    def time(self, loaded, iters: int) -> Timing:
        timing = time_compiled(loaded, self.sets, self.scalars, self.stream, iters=iters,
                               warmup=self.warmup)
        sync(self.stream, f"timing {loaded.name}")
        return timing

    def check(self, candidate: Candidate, loaded) -> tuple[bool, str]:
        """Run on fresh random inputs with poisoned outputs and compare with the reference:
        (passed, what failed)."""
        report = run(self.kernel, candidate.plan, candidate.source, self.dims, check=True,
                     bench=False, seed=self.seed + 1, scalars=self.scalars, compiled=loaded)
        failed = [f"{c.name}: {c.result.bad} bad, {c.result.unwritten} unwritten, max abs "
                  f"error {c.result.max_abs:.3g}" for c in report.checks if not c.result.ok]
        return not failed, "; ".join(failed)
