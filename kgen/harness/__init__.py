"""kgen's test and benchmark harness: random inputs, the run of `kgen run`, the check against the
NumPy reference, timing with CUDA events and the PyTorch baseline. It reads the IR (the
reference is defined on it), the plan and the runtime; the runtime never imports it.

The run itself is `kgen.harness.run.run` (not re-exported here, so that the name
`kgen.harness.run` stays the module)."""
from .run import OutputCheck, RunReport
from .timing import Timing, time_kernel

__all__ = ["OutputCheck", "RunReport", "Timing", "time_kernel"]
