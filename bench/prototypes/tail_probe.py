"""The sweep's part-empty last waves (issue 17), on the cooperative kernel: is stream-K slower
than the data-parallel walk because of its walk, or because the tuner's list runs it on 3
stages where the data-parallel 128x256 runs 4? And is 3000x5000x2000's mispick (128x192 loses
to 128x256 where the wave model expects it to win, bench/RESULTS.md) its ragged N? Each variant
is a Schedule value, checked against the reference, timed beside torch.matmul (CUDA-event
medians, inputs rotated past L2).

    bash .gpu/device-run.sh python3 bench/prototypes/tail_probe.py [--shapes tail|ragged|all]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from defaults import BARE  # noqa: E402
from tail_probe2 import table  # noqa: E402

# the sweep's shapes whose last wave of 128x256 tiles is part empty, then my own
TAIL = [(3000, 5000, 2000), (4096, 4096, 4096), (6144, 5120, 3072), (4096, 4096, 11008),
        (2048, 2048, 2048), (2560, 7168, 4096), (1536, 1536, 6144)]
# N around 5000: 4992 = 26 x 192 (every row 128-byte aligned), 5008 (8 columns more, rows
# misaligned like 5000's), 5056 = 79 x 64 (aligned, last 192-column tile a third full)
RAGGED = [(3000, 4992, 2000), (3000, 5008, 2000), (3000, 5056, 2000)]


def variants():
    from kgen.targets import Config, GemmConfig
    return {
        "128x256 s4": Config((GemmConfig((128, 256, 64), (2, 4), 4),)),
        "128x192 s4": Config((GemmConfig((128, 192, 64), (2, 4), 4),)),
        "stream 128x256 s3": Config((GemmConfig((128, 256, 64), (2, 4), 3, stream=True),)),
        "stream 128x256 s4": Config((GemmConfig((128, 256, 64), (2, 4), 4, stream=True),)),
        "stream 128x192 s4": Config((GemmConfig((128, 192, 64), (2, 4), 4, stream=True),)),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", choices=("tail", "ragged", "all"), default="all")
    args = parser.parse_args()
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    shapes = {"tail": TAIL, "ragged": RAGGED, "all": TAIL + RAGGED}[args.shapes]
    table(module.kernels[0], shapes, variants(), width=18,
          skip=lambda shape, name: shape in RAGGED and name == "stream 128x192 s4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
