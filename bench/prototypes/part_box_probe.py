"""Tiles whose N is not a multiple of 64 on the cooperative kernel (issue 17, the sweep's
3000x5000x2000): 256-row tiles up to 192 columns, their last staging box part full and copied
out by the consumers' threads while the whole boxes leave through the copy engine. Each variant
is a Schedule value (a Config), checked against the float64 reference on random inputs with its
outputs poisoned, then timed beside torch.matmul (CUDA-event medians of 30, inputs rotated past
L2).

    tiles  the builder's sized choice against 256x128 s4 and 256 x 144, 160, 176, 192 s3 (the
           ring of 4 does not fit beside the epilogue tile's staging), over 3000x5000x2000
           (cuBLAS: 396 tiles of our 256x152, 3.0 waves; 256x160: 384, 2.9; 128x256: 480,
           3.6), the bare sweep's large shapes, my own and shapes never probed where one of the
           new widths fills its waves
    fused  relu(alpha*acc + beta*C + bias[col]) (C through the staging, its last box loaded
           whole) on the sized choice against 256x160 s3, x unfused PyTorch
    narrow 256x152 (an odd number of n8 column groups: cuBLAS's tile at 3000x5000x2000) on 3
           and 4 stages, 256x160 and 256x144 on 4 (one staging box per consumer)
    rule152  the wave model without 256x152 s4 and with it, two rounds, where it changes the
           choice (shapes drawn at random, seed 7, by what they ran before and by B's rows)
    rule   the wave model without 256x192 s3 and 256x176 s3 (before) and with them (after, the
           product path), two rounds, where it changes the choice: the sweep's and my own
           shapes seen in `tiles`, then shapes never probed, drawn at random (seed 11) among
           the 2.2% of 3000 random shapes whose choice changes; the bare GEMM (f16, bf16) and
           the fused kernel above

    bash .gpu/device-run.sh python3 bench/prototypes/part_box_probe.py [--part tiles fused]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from defaults import BARE, OWN, SWEEP  # noqa: E402
from wide_probe import grid, parsed, tiles_table  # noqa: E402

# never probed: 256x160 fills 3 waves of 132 SMs at the first two (12 x 33 tiles), 2 at the
# third; 256x176 fills 1 at the fourth (12 x 11), 256x192 at the fifth; a shape near cuBLAS's
# 3000x5000 pick; then ones drawn with no width in mind
NEW = [(3072, 5280, 2048), (3000, 5200, 3072), (2900, 3500, 4096), (3000, 1936, 4096),
       (3072, 2112, 4096), (2800, 4900, 2000), (5000, 6000, 3000), (7000, 3000, 2048)]


def variants(widths=(144, 160, 176, 192)):
    from kgen.targets import Config, GemmConfig
    out = {"sized": None, "256x128 s4": Config((GemmConfig((256, 128, 64), (2, 4), 4),))}
    for n in widths:
        out[f"256x{n} s3"] = Config((GemmConfig((256, n, 64), (2, 4), 3),))
    out["256x160 s3 c2x1"] = Config((GemmConfig((256, 160, 64), (2, 4), 3, cluster=(2, 1)),))
    return out


# seen in `tiles` (128x192 s4 before), then drawn at random: five that take 256x192, five 256x176
RULE = [(6144, 5120, 3072), (2560, 7168, 4096), (5120, 3584, 2048),
        (4320, 4208, 4672), (6096, 5088, 2048), (5280, 5720, 2496), (2248, 8024, 8000),
        (6544, 6544, 6272),
        (7848, 600, 3520), (5304, 856, 5696), (5616, 816, 1344), (1840, 5712, 3584),
        (6112, 1880, 3136)]


def rule_table():
    some = RULE[:3] + RULE[8:10]
    tiles_table({"bare": RULE, "bf16": some, "fused": some}, ((256, 192), (256, 176)))


# 256x152 (cuBLAS's tile at 3000x5000x2000): 12 x 33 = 396 tiles, 3.0 waves; then shapes where
# it fills 1 and 2 waves (12 x 11, 12 x 22 tiles) and two it does not fill
NARROW = [(3000, 5000, 2000), (3000, 1672, 4096), (3072, 3344, 2048), (2900, 4980, 3000),
          (4096, 4096, 4096), (6144, 5120, 3072)]


def narrow_variants():
    """256x152 (odd n8 groups) and the 4-stage rings that one staging box per consumer
    leaves room for."""
    from kgen.targets import Config, GemmConfig
    out = {"sized": None}
    for n, stages in ((152, 3), (152, 4), (160, 3), (160, 4), (144, 4)):
        out[f"256x{n} s{stages}"] = Config((GemmConfig((256, n, 64), (2, 4), stages),))
    out["256x160 s4 c2x1"] = Config((GemmConfig((256, 160, 64), (2, 4), 4, cluster=(2, 1)),))
    return out


# where 256x152 s4 changes the choice (4% of 3000 random shapes): in place of the line rule's
# 128x256 on 2x1 (B's rows 32-byte, then 16-byte multiples), of 64x192 s7 (rows 16-byte, 32-byte,
# whole lines), of 128x128 s6 and of 256x176 s3
RULE152 = [(3000, 5000, 2000), (3936, 1080, 2480), (7392, 1272, 2720), (5152, 1744, 4904),
           (5312, 848, 3736), (1408, 3296, 5432), (2400, 1744, 1184), (2440, 1768, 2816),
           (3192, 2984, 3200), (5208, 912, 3776)]


def rule152_table():
    tiles_table({"bare": RULE152, "fused": [RULE152[i] for i in (0, 3, 7)]}, ((256, 152),))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", nargs="+", choices=("tiles", "fused", "rule", "narrow", "rule152"),
                        default=["tiles", "fused"])
    args = parser.parse_args()
    if "tiles" in args.part:
        big = [s for s in SWEEP + OWN if s[0] * s[1] >= 2048 * 4096]
        grid(parsed(BARE.format(t="f16"), "bare"), [(3000, 5000, 2000)] + big + NEW, variants(),
             width=15)
    if "fused" in args.part:
        from misaligned_probe import FUSED
        from kgen.targets import Config, GemmConfig
        cells = {"sized": None,
                 "256x160 s3": Config((GemmConfig((256, 160, 64), (2, 4), 3),)),
                 "256x160 s3 c2x1": Config((GemmConfig((256, 160, 64), (2, 4), 3,
                                                       cluster=(2, 1)),))}
        grid(parsed(FUSED, "fused"), [(3000, 5000, 2000), (4096, 4096, 4096), (3072, 5280, 2048),
                                      (8192, 8192, 512)], cells, width=15)
        print("(the fused kernel: x unfused PyTorch)")
    if "rule" in args.part:
        rule_table()
    if "rule152" in args.part:
        rule152_table()
    if "narrow" in args.part:
        grid(parsed(BARE.format(t="f16"), "bare"), NARROW, narrow_variants(), width=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
