"""K = 8 (mod 16) with 16-bit operands (issue 17): A's and B's rows 16-byte but not 32-byte
multiples, where kgen's copy-engine path ran 0.44-0.64x torch.matmul on an H100
(bench/logs/tail_probe/tail_validate_h100.log). What is it: the rows' alignment (16, 32 or 128
bytes), the K tail, or the schedule? Each variant is a Schedule value (or the maps' L2
promotion, patched on the Python launcher's side), checked against the reference and timed
beside torch.matmul (CUDA-event medians, inputs rotated past L2).

    k         the builder's sized choice at 5000x3000xK for K around 1024 and 2000, rows of
              16, 32, 128-byte alignment
    variants  tiles, clusters (multicast halves the L2 reads of one operand) at the slow sizes
              and their aligned neighbours
    promotion the maps' L2 promotion (kgen encodes L2_256B) at the same sizes
    combo     clusters with each promotion, at rows of 16-, 32- and 128-byte alignment, shapes
              not probed before among them
    sweep     the builder's sized choice over the bare sweep and my own shapes (all rows
              128-byte aligned) with the loads' promotion L2_256B, then L2_128B, alternating
    rule      the product path (builder.sized: 128x256 s4 cluster 2x1 where the rows split
              sectors; the operands' L2_128B) against it before (the rule off, L2_256B), two
              rounds, the bare GEMM and relu(alpha*acc + beta*C + bias[col]), shapes never
              probed before among them
    rule2     the same for a row-major B (cluster 1x2) at B rows of 16-byte alignment (N = 5000,
              3000, 6600, 4104, 8200), and the bare bf16 GEMM at three of RULE's shapes
    rule32    B's rows 32-byte but not 128-byte multiples (K = 16 mod 64): the wave model's
              tile (the rule before 2026-11-28's second stop) against the product path (128x256
              s4 on a cluster 2x1 there), two rounds, shapes never probed before among them
    nn        a row-major B (MN-major: rows along N), where the rule does not apply: the sized
              choice, 128x256 s4 and on a cluster 1x2 (A multicast)
    check     the product path against the rule of the stop before, at shapes never probed
              before (CHECK), two rounds
    gap       where the line rule lost or the sweep stays under 1.0 (2560x7168 at K = 2448 and
              1776, 3000x5000x2000): 128x256 and 128x192 on each cluster, two rounds (written
              for the next visit; not run yet)
    mn        a row-major B at rows of 16-, 32- and 128-byte alignment: 128x256 s4 alone, on a
              cluster 1x2 (A multicast) and 2x1 (B multicast: each CTA loads half of the
              MN-major tile's 64-column boxes), two rounds, shapes never probed before among them

    bash .gpu/device-run.sh python3 bench/prototypes/misaligned_probe.py [--part k variants promotion]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from defaults import BARE, kgen_run, label  # noqa: E402
from epilogue_cost import HEAD  # noqa: E402
from kernels import without_schedule_lines  # noqa: E402
from tail_probe2 import table  # noqa: E402

# K: 1000 (rows 2000 bytes: 16-byte), 1008 (32-byte), 1016 (16), 1024 (128), 1032 (16),
# 1040 (32), 1088 (128); 2000 (4000 bytes: 32-byte), 2008 (16), 2048 (128)
K_SWEEP = [(5000, 3000, k) for k in (1000, 1008, 1016, 1024, 1032, 1040, 1088, 2000, 2008, 2048)]
SLOW = [(5000, 3000, 1000), (5000, 3000, 1008), (5000, 3000, 1024), (2000, 7000, 3000),
        (2000, 7000, 3008), (4096, 4096, 4104), (4096, 4096, 4096)]


def variants():
    from kgen.targets import Config, GemmConfig
    out = {}
    for n, s in ((256, 4), (192, 4), (128, 6)):
        for cluster in ((1, 1), (2, 1), (1, 2)):
            name = f"128x{n} s{s}" + (f" c{cluster[0]}x{cluster[1]}" if cluster != (1, 1) else "")
            out[name] = Config((GemmConfig((128, n, 64), (2, 4), s, cluster=cluster),))
    return out


def promotions(kernel, shapes):
    from kgen.targets import Config, GemmConfig
    config = {"128x256 s4": Config((GemmConfig((128, 256, 64), (2, 4), 4),)),
              "128x192 s4": Config((GemmConfig((128, 192, 64), (2, 4), 4),))}
    for promotion in ("L2_256B", "L2_128B", "L2_64B", "NONE"):
        promoted(promotion)
        print(f"-- loads' L2 promotion {promotion}")
        table(kernel, shapes, config)
    promoted("L2_128B")


# rows 16-byte aligned (the first five; 3072x6144x1800 and 8000x2000x2504 not probed before),
# 32-byte (3000x5000x2000, the sweep's slow size, and 6144x2048x1520, new), 128-byte
COMBO = [(5000, 3000, 1000), (2000, 7000, 3000), (4096, 4096, 4104), (3072, 6144, 1800),
         (8000, 2000, 2504), (3000, 5000, 2000), (5000, 3000, 1008), (6144, 2048, 1520),
         (4096, 4096, 4096), (5000, 3000, 1024)]


def promoted(promotion):
    """The operands' L2 promotion set to `promotion` (kgen/targets/sm90/warp_specialized.py)."""
    from kgen.targets.sm90 import warp_specialized
    warp_specialized.OPERAND_PROMOTION = promotion


def combo(kernel):
    from kgen.targets import Config, GemmConfig
    out = {}
    for tile, cluster in (((128, 256, 64), (1, 1)), ((128, 256, 64), (2, 1)),
                          ((128, 256, 64), (1, 2)), ((128, 192, 64), (2, 1))):
        base = Config((GemmConfig(tile, (2, 4), 4, cluster=cluster),))
        for promotion in ("L2_256B", "L2_128B", "L2_64B"):
            out[f"{tile[1]} c{cluster[0]}x{cluster[1]} {promotion[3:]}"] = (base, promotion)
    return out


def combo_table(kernel, shapes):
    from kgen import ir
    cells = combo(kernel)
    print(f"{'M x N x K':<18} {'align':>5} {'matmul ms':>9} " + " ".join(f"{n:>14}" for n in cells))
    for m, n, k in shapes:
        sizes, torch_ms, row = dict(M=m, N=n, K=k), None, []
        for name, (config, promotion) in cells.items():
            promoted(promotion)
            report, _ = kgen_run(kernel, sizes, ir.Arch.SM90A, torch_baseline=torch_ms is None,
                                 config=config, sized=False)
            torch_ms = torch_ms or report.torch_timing.median_ms
            row.append(f"{torch_ms / report.timing.median_ms:>14.3f}" if report.ok
                       else f"{'CHECK FAILED':>14}")
        align = max(a for a in (16, 32, 64, 128) if 2 * k % a == 0)
        print(f"{f'{m}x{n}x{k}':<18} {align:>5} {torch_ms:>9.4f} " + " ".join(row), flush=True)
    print("(x torch.matmul, f16, sm_90a; cN: cluster, then the loads' L2 promotion)")


def sweep_table(kernel):
    from kgen import ir
    from defaults import OWN, SWEEP
    print(f"{'M x N x K':<18} {'256B':>7} {'128B':>7} {'256B':>7} {'128B':>7}  schedule")
    for m, n, k in SWEEP + OWN:
        sizes, torch_ms, row = dict(M=m, N=n, K=k), None, []
        for promotion in ("L2_256B", "L2_128B") * 2:
            promoted(promotion)
            report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A, torch_baseline=torch_ms is None)
            torch_ms = torch_ms or report.torch_timing.median_ms
            row.append(f"{torch_ms / report.timing.median_ms:>7.3f}" if report.ok
                       else f"{'FAILED':>7}")
        print(f"{f'{m}x{n}x{k}':<18} " + " ".join(row) + f"  {label(plan)}", flush=True)
    print("(x torch.matmul, f16, sm_90a, the builder's sized choice; two rounds)")


# bench/epilogue_cost.py's kernel with its schedule lines deleted, on sm_90a
FUSED = without_schedule_lines(HEAD.format(
    name="fused", expr="relu(alpha * acc + beta * C + bias[col])")).replace("sm_80", "sm_90a")
# rows 16-byte aligned: the five of COMBO, then four never probed (K = 1320, 2200, 8200, 3080);
# then 32- and 128-byte aligned rows, which the rule leaves alone
RULE = [(5000, 3000, 1000), (2000, 7000, 3000), (4096, 4096, 4104), (3072, 6144, 1800),
        (8000, 2000, 2504), (6000, 4000, 1320), (3500, 9000, 2200), (8192, 8192, 8200),
        (4608, 2304, 3080), (128, 4096, 4104), (3000, 5000, 2000), (4096, 4096, 4096)]


def rounds_table(kernels, shapes, patch, what):
    """Each kernel at each of its `shapes` (kernel name -> list) before and after, two rounds
    in turn; `patch(after)` sets kgen up for either (the caller puts kgen back)."""
    from kgen import ir
    print(f"{'kernel':<6} {'M x N x K':<18} {'torch ms':>8} {'before':>7} {'after':>7} "
          f"{'before':>7} {'after':>7}  after's schedule")
    for name, kernel in kernels.items():
        for m, n, k in shapes[name]:
            sizes, torch_ms, row = dict(M=m, N=n, K=k), None, []
            for after in (False, True) * 2:
                patch(after)
                report, plan = kgen_run(kernel, sizes, ir.Arch.SM90A,
                                        torch_baseline=torch_ms is None)
                torch_ms = torch_ms or report.torch_timing.median_ms
                row.append(f"{torch_ms / report.timing.median_ms:>7.3f}" if report.ok
                           else f"{'FAILED':>7}")
                shown = label(plan) if after else ""
            print(f"{name:<6} {f'{m}x{n}x{k}':<18} {torch_ms:>8.4f} " + " ".join(row)
                  + f"  {shown}", flush=True)
    print(f"(x PyTorch: torch.matmul, or the unfused epilogue; {what}; two rounds)")


def rule_table(kernels, shapes):
    """Before: the sector rule off and the operands' L2_256B; after: the product path."""
    from kgen.targets.sm90 import configs, warp_specialized
    rule = configs.line_split_rows

    def patch(after):
        configs.line_split_rows = rule if after else (lambda shape, sizes: None)
        warp_specialized.OPERAND_PROMOTION = "L2_128B" if after else "L2_256B"

    rounds_table(kernels, shapes, patch, "before: the rule off and the operands' L2_256B")
    patch(True)


RULE32 = [(3000, 5000, 2000), (5000, 3000, 1008), (6144, 2048, 1520), (4096, 4096, 4112),
          (8192, 4096, 3056), (2560, 7168, 2448), (3500, 6000, 5136), (2000, 7000, 1040),
          (4096, 4096, 4096)]


def rule32_table(kernels, shapes=None):
    """Before: the rule as it was (a cluster only where B's rows are 16-byte but not 32-byte
    multiples: 2x1 for a K-major B, 1x2 sharing A for a row-major one); after: the product
    path (2x1 wherever B's rows are not whole 128-byte lines, a row-major B's boxes shared)."""
    from kgen.targets.sm90 import configs
    rule = configs.line_split_rows

    def sector_split(shape, sizes):
        row = configs.common.known(shape.k if shape.k_major[1] else shape.n, sizes) * \
            shape.dtype.nbytes
        if row % 32 == 0 or rule(shape, sizes) is None:
            return None
        return (2, 1) if shape.k_major[1] else (1, 2)

    def patch(after):
        configs.line_split_rows = rule if after else sector_split

    rounds_table(kernels, shapes or {name: RULE32 for name in kernels}, patch,
                 "before: the rule of the stop before (16-byte rows only; a row-major B's "
                 "cluster 1x2)")
    patch(True)


# never probed before the rule was written: B's rows of 64-byte (K or N = 32 mod 64), 32-byte
# and 16-byte multiples, K-major and row-major B, f16 and bf16; an aligned control each
CHECK = {"bare": [(3000, 5000, 1056), (4096, 4096, 4128), (6000, 3000, 3024), (2560, 7168, 1776),
                  (5120, 5120, 5120)],
         "nn": [(3000, 5024, 2048), (4096, 3104, 4096), (2560, 6160, 3072), (5000, 6024, 1024),
                (6000, 3016, 4096), (5120, 5120, 5120)],
         "nn_bf16": [(4096, 6024, 2048), (3000, 5024, 3072)]}


def nn_table(kernel):
    from kgen.targets import Config, GemmConfig
    cells = {"sized": None}
    for cluster in ((1, 1), (1, 2)):
        cells[f"128x256 s4 c{cluster[0]}x{cluster[1]}"] = Config(
            (GemmConfig((128, 256, 64), (2, 4), 4, cluster=cluster),))
    from kgen import ir
    print(f"{'M x N x K':<18} {'matmul ms':>9} " + " ".join(f"{c:>16}" for c in cells))
    for m, n, k in ((5000, 3000, 1000), (4096, 4096, 4104), (4096, 4104, 4096),
                    (5000, 3000, 1024), (4096, 4096, 4096)):
        sizes, torch_ms, row = dict(M=m, N=n, K=k), None, []
        for config in cells.values():
            report, _ = kgen_run(kernel, sizes, ir.Arch.SM90A, torch_baseline=torch_ms is None,
                                 config=config, sized=config is None)
            torch_ms = torch_ms or report.torch_timing.median_ms
            row.append(f"{torch_ms / report.timing.median_ms:>16.3f}" if report.ok
                       else f"{'FAILED':>16}")
        print(f"{f'{m}x{n}x{k}':<18} {torch_ms:>9.4f} " + " ".join(row), flush=True)
    print("(x torch.matmul, f16, B row-major)")


# row-major B: N = 8 mod 16 (rows 16-byte), 16 mod 64 (32-byte), then aligned controls
MN = [(3000, 5000, 2000), (4096, 4104, 4096), (8192, 8200, 4096), (3500, 7000, 2048),
      (2560, 9000, 3072), (4096, 4112, 4096), (3000, 5008, 2000), (4096, 4096, 4096),
      (6144, 6144, 2048)]


GAP = [(2560, 7168, 2448), (2560, 7168, 1776), (3000, 5000, 2000), (2560, 7168, 2048)]


def gap_table(kernel):
    from kgen.targets import Config, GemmConfig
    cells = {}
    for round_ in "ab":
        for n, stages, cluster in ((256, 4, (1, 1)), (256, 4, (2, 1)), (256, 3, (2, 1)),
                                   (256, 4, (1, 2)), (192, 4, (1, 1)), (192, 4, (2, 1))):
            cells[f"{n} s{stages} c{cluster[0]}x{cluster[1]} {round_}"] = Config(
                (GemmConfig((128, n, 64), (2, 4), stages, cluster=cluster),))
    table(kernel, GAP, cells, width=15)
    print("(128xN, K-major B; two rounds a, b)")


def cluster_rounds(clusters, sized=False):
    """Cells of 128x256 s4 on each cluster, two rounds a and b (`sized`: the sized choice first
    in each round)."""
    from kgen.targets import Config, GemmConfig
    cells = {}
    for round_ in "ab":
        if sized:
            cells[f"sized {round_}"] = None
        for cluster in clusters:
            cells[f"c{cluster[0]}x{cluster[1]} {round_}"] = Config(
                (GemmConfig((128, 256, 64), (2, 4), 4, cluster=cluster),))
    return cells


def mn_table(kernel):
    table(kernel, MN, cluster_rounds(((1, 1), (1, 2), (2, 1))), width=9)
    print("(128x256 s4, B row-major: c1x2 shares A, c2x1 shares B's boxes; two rounds a, b)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", nargs="+", choices=("k", "variants", "promotion", "combo", "sweep", "rule", "rule2", "rule32",
                                 "nn", "mn", "check", "gap"),
                        default=["k", "variants", "promotion"])
    args = parser.parse_args()
    from kgen import ir
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    if "k" in args.part:
        print(f"{'M x N x K':<18} {'row bytes':>9} {'align':>5} {'x matmul':>8}  schedule")
        for m, n, k in K_SWEEP:
            report, plan = kgen_run(kernel, dict(M=m, N=n, K=k), ir.Arch.SM90A)
            align = max(a for a in (16, 32, 64, 128) if 2 * k % a == 0)
            ratio = report.torch_timing.median_ms / report.timing.median_ms
            print(f"{f'{m}x{n}x{k}':<18} {2 * k:>9} {align:>5} "
                  f"{ratio if report.ok else 'CHECK FAILED':>8.3f}  {label(plan)}", flush=True)
    if "variants" in args.part:
        table(kernel, SLOW, variants(), width=13)
    if "promotion" in args.part:
        promotions(kernel, SLOW[:4])
    if "combo" in args.part:
        combo_table(kernel, COMBO)
    if "sweep" in args.part:
        sweep_table(kernel)
    if "rule" in args.part:
        fused = parse(FUSED, "fused.kg")
        verify(fused)
        rule_table({"bare": kernel, "fused": fused.kernels[0]}, {"bare": RULE, "fused": RULE})
    if "rule2" in args.part:
        kernels = {}
        for name, text in (("nn", BARE.format(t="f16").replace("[K, N] col", "[K, N] row")),
                           ("bf16", BARE.format(t="bf16"))):
            module = parse(text, f"{name}.kg")
            verify(module)
            kernels[name] = module.kernels[0]
        rule_table(kernels, {"nn": [(3000, 5000, 2000), (6000, 3000, 2048), (4000, 6600, 1024),
                                    (4096, 4104, 4096), (5000, 3000, 1000), (8192, 8200, 4096),
                                    (4096, 4096, 4096)],
                             "bf16": [(5000, 3000, 1000), (6000, 4000, 1320), (3500, 9000, 2200)]})
    if "rule32" in args.part:
        fused = parse(FUSED, "fused.kg")
        verify(fused)
        rule32_table({"bare": kernel, "fused": fused.kernels[0]})
    if "nn" in args.part:
        nn = parse(BARE.format(t="f16").replace("[K, N] col", "[K, N] row"), "nn.kg")
        verify(nn)
        nn_table(nn.kernels[0])
    if "check" in args.part:
        kernels = {}
        for name, text in (("bare", BARE.format(t="f16")),
                           ("nn", BARE.format(t="f16").replace("[K, N] col", "[K, N] row")),
                           ("nn_bf16", BARE.format(t="bf16").replace("[K, N] col", "[K, N] row"))):
            module = parse(text, f"{name}.kg")
            verify(module)
            kernels[name] = module.kernels[0]
        rule32_table(kernels, CHECK)
    if "gap" in args.part:
        gap_table(kernel)
    if "mn" in args.part:
        nn = parse(BARE.format(t="f16").replace("[K, N] col", "[K, N] row"), "nn.kg")
        verify(nn)
        mn_table(nn.kernels[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
