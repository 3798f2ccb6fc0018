"""How the warp-specialized kernel's epilogue walks its accumulator fragments
(EpilogueGroups): in one unrolled walk, or in a rolled loop over groups of 64
columns whose fragments are copied out of acc by constant indices.

The unrolled walk inlines the EVT once per fragment pair, 64 times per consumer thread of a
128x256 tile. For an EVT of libdevice functions that is most of NVRTC's time; in groups it is
emitted once per group's width. Measured on an H100 machine (bench/logs/epilogue_groups/, the
fast entry point alone on its CPU; time against the same plan unrolled, 4096^3 and
8192x8192x4096):
- pairs from registers: evt_multi_output (gelu, two outputs) 1.04 s unrolled, 0.48 s in 4
  groups, and 0.3-1.0% faster; evt_softmax_stats (exp, row reductions) 0.53 against 0.43 s,
  but 2% slower;
- the staging (stmatrix and TMA stores): gelu(acc) * scale[row] 0.69 against 0.41 s, 1.2-1.5%
  slower; gelu(acc + bias[col]) 0.77 against 0.50 s, 1%; silu 0.75 against 0.47 s, 1.5%;
  tanh 0.52 against 0.37 s, 3-4%.
The groups are taken from one erff-sized function per element on, on either path: through the
staging they cost 1-1.5% of the run time for gelu, but unrolled, `C + 0.5 * gelu(acc)` took
1.21-1.30 s to compile and load (kgen.load) on one H100 instance (bench/logs/issue15_final/
hopper_gemm.log; the bare gemm 0.42-0.61 s there), over issue 15's second. Lighter EVTs (tanh, silu, exp) stay unrolled, where the
groups cost most (3-4% for tanh)."""
from __future__ import annotations

from ...enums import Axis, Op
from ...plan import EpilogueMath, GemmPlan, StorePath
from ...plan.epilogue import Apply

GROUP_COLUMNS = 64  # one staging box: 8 m16n8 fragments

# Each op's inlined code, in PTX instructions per element where it is more than a few: the PTX
# of `D = op(acc)` on a 128x256 tile (NVRTC 13.0, sm_90a, the fast entry point) less that of
# `D = acc`, over the 128 elements a consumer thread holds, at about 35 bytes an instruction.
INLINED = {
    Op.LOG: 38,
    Op.GELU: 35,  # erff
    Op.GELU_TANH: 28,
    Op.TANH: 20,
    Op.SILU: 15,
    Op.SIGMOID: 14,
    Op.EXP: 12,
}
# The same under EpilogueMath's intrinsics (kgen/targets/sm90/epilogue_math.py), NVRTC 13.5: gelu's
# gelu_phi 35 (its polynomial's constants are PTX moves), silu and sigmoid 4, exp 2
INLINED_INTRINSICS = {**INLINED, Op.GELU: 35, Op.SILU: 4, Op.SIGMOID: 4, Op.EXP: 2}
# The weight per element from which the walk is rolled: one erff
GROUP_FROM = 35


def epilogue_groups(g: GemmPlan, split_k: int, store: StorePath,
                    math: EpilogueMath = EpilogueMath()) -> tuple[int, str]:
    """(groups, why) for the fast entry point's epilogue of `g`, its functions spelled as `math`
    says; why is empty where the question does not arise (no epilogue runs in the kernel, or
    one group spans the tile)."""
    groups = g.tile[1] // GROUP_COLUMNS
    if split_k > 1 or g.tile[1] % GROUP_COLUMNS or groups < 2:
        return 1, ""
    inlined = INLINED_INTRINSICS if math.intrinsics else INLINED
    weight = sum(inlined.get(n.kind.op, 0) for n in g.epilogue.nodes if isinstance(n.kind, Apply))
    if weight == 0:
        return 1, ""
    path = "pairs from registers" if store is StorePath.PAIRS else "the staging"
    if weight < GROUP_FROM:
        return 1, (f"the EVT inlines about {weight} instructions per element, under the "
                   f"{GROUP_FROM} from which the walk rolls: unrolled, the compiler interleaves "
                   "every fragment's work")
    if any(r.axis is Axis.COL for r in g.epilogue.reductions):
        return 1, ("a column reduction's partials are indexed by the fragment: the walk stays "
                   "unrolled")
    return groups, (f"the EVT inlines about {weight} instructions per element (rolled from "
                    f"{GROUP_FROM}; the output leaves through {path}): one copy of them per 64 "
                    f"columns, in a rolled loop over the tile's {groups} groups, keeps NVRTC's "
                    "time down")
