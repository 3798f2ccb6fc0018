"""The golden snapshots: every example's emitted .cu and .h, for its own target and for sm_90a
where the example plans for it (an example whose shared memory or rules do not fit sm_90a has
only its own target's)."""
from __future__ import annotations

from pathlib import Path

from kgen import ir
from kgen.api import build_file, read_module
from kgen.errors import KgenError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = Path(__file__).resolve().parent
EXAMPLES = sorted((ROOT / "examples").glob("*.kg"))


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def archs_of(path: Path) -> list[ir.Arch | None]:
    """None (the example's own target), then sm_90a when that is another target."""
    module, _ = read_module(path)
    own = module.kernels[0].target
    return [None] if own is ir.Arch.SM90A else [None, ir.Arch.SM90A]


def snapshots():
    """(file name, text) for every snapshot, in a fixed order."""
    for path in EXAMPLES:
        module, _ = read_module(path)
        kernel = module.kernels[0]
        if not (kernel.gemms or kernel.loop or kernel.epilogue):  # storage only: nothing to emit
            continue
        own = module.kernels[0].target
        for arch in archs_of(path):
            stem = f"{path.stem}.{(arch or own).value}"
            try:
                # recorded as `kgen compile examples/NAME.kg [--arch ARCH] -o STEM.cu
                # --header STEM.h`: relative paths, the same on every machine
                built = build_file(_relative(path), arch, output=f"{stem}.cu",
                                   header=f"{stem}.h")
            except KgenError:
                if arch is None:
                    raise
                continue  # does not plan for sm_90a
            yield f"{stem}.cu", built.source
            yield f"{stem}.h", built.header
