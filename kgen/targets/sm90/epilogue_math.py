"""How the warp-specialized kernel's epilogue spells its transcendental functions (plan:
EpilogueMath), and the C++ of those spellings (OPS, beside epilogue_cpp.OP_CPP).

The consumers run the epilogue with the tensor cores idle, so its instructions are what a fused
epilogue costs on top of the bare kernel. On an H200 (bench/fused_llama.py, 2026-11-29, issue
53's Llama-class shapes, the builder's cooperative 128x256 s4 plan), `silu(acc) * U` ran 1.115x
the bare kernel's time (1.169x at 2048x4096x4096) and `gelu(acc + bias[col])` 1.079x (1.115x),
where `acc + C`, the same bytes as the SwiGLU gate without its function, ran 1.032x. The bytes
were not the cost: prefetching U's later boxes into L2 at every size, or loading them at the
tile's start, ran 1.124x and 1.136x; whole-tile staging on 3 stages 1.153x. With the spellings
below (the same run, the plan as written beside it): silu(acc) * U 1.029x (as written 1.102x),
gelu(acc + bias[col]) 1.060x (1.068x), highest 1.058x and 1.096x. What remains of gelu's is its
instructions at the epilogue's issue rate: about 20 a element, 128 elements a consumer thread,
two warps a scheduler, some 5,100 issue cycles (2.6 us) against a 128x256x4096 tile's 45 us.

- exp, sigmoid, silu: the hardware's ex2 (__expf: x log2(e), then ex2.approx) and the
  reciprocal-and-multiply division (__fdividef, whose result is 0 where the divisor's magnitude
  passes 2^126: the limit of x / (1 + e^-x) there), in place of expf's range reduction and the
  IEEE division's Newton steps and slow path: about 5 instructions a silu against 20.
- gelu: x Phi(x) with Phi(x) = 1 - e / 2 for x >= 0 and e / 2 below, e = erfc(|x| / sqrt 2) =
  2^-q(|x|), q a polynomial of degree 10 in |x| clamped to 6 (GELU_Q; one branch, 10 FMAs and
  an ex2), in place of 0.5 x (1 + erff(x / sqrt 2)), whose two branches a warp runs both of. Its
  error against the float64 x Phi(x), in f32 over |x| <= 200: at most 3.1e-6 relative for
  |x| <= 6 and 3.9e-7 absolute anywhere (the erff form's relative error reaches 1 at x = -6,
  where 1 + erff(x / sqrt 2) rounds to 0); past |x| = 6, Phi(-6) = 1e-9 stands for the tail.
"""
from __future__ import annotations

from ...enums import Op
from ...plan import EpilogueMath, GemmPlan
from ...plan.epilogue import Apply
from ..common.epilogue_cpp import OP_CPP, float_literal

# q(u) = -log2(erfc(u / sqrt 2)) on [0, 6], lowest power first: the least-squares Chebyshev fit of
# degree 10 on 400001 points, converted to powers and rounded to float32 (its f32 Horner's worst
# error in q, 6e-6, is the rounding of q up to 29)
GELU_Q = (-1.2348892e-06, 1.151132, 0.45906848, 0.05279457, -0.007375846, 0.00030187893,
          0.00015038524, -4.2348864e-05, 5.562622e-06, -3.877924e-07, 1.14976855e-08)
GELU_CLAMP = 6.0

OPS: dict[Op, str] = {
    **OP_CPP,
    Op.EXP: "__expf({0})",
    Op.SIGMOID: "__fdividef(1.0f, 1.0f + __expf(-{0}))",
    Op.SILU: "__fdividef({0}, 1.0f + __expf(-{0}))",
    Op.GELU: "gelu_phi({0})",  # templates/sm90/epilogue_math.inc.j2
}
RESPELLED = (Op.EXP, Op.SIGMOID, Op.SILU, Op.GELU)
WHY_INTRINSICS = ("the consumers run the epilogue with the tensor cores idle, so its "
                  "instructions are the fused kernel's cost: ")
WHY_EXPONENTIAL = ("{ops} on the hardware's ex2 and reciprocal (__expf, __fdividef: about 5 "
                   "instructions a silu against 20)")
WHY_GELU = ("gelu's Phi as 2^-q(|x|), q a polynomial of degree 10 (about 15 instructions; erff "
            "runs two branches)")


def epilogue_math(g: GemmPlan) -> EpilogueMath:
    """How the epilogue of `g` spells exp, sigmoid, silu and gelu; no row in `kgen inspect`
    where it applies none of them."""
    ops = [op for op in RESPELLED if _applies(g, op)]
    if not ops:
        return EpilogueMath()
    exponential = [op.spelling for op in ops if op is not Op.GELU]
    parts = (([WHY_EXPONENTIAL.format(ops=", ".join(exponential))] if exponential else [])
             + ([WHY_GELU] if Op.GELU in ops else []))
    return EpilogueMath(True, WHY_INTRINSICS + "; ".join(parts))


def ops(math: EpilogueMath) -> dict[Op, str]:
    """Each op's C++ under the plan's EpilogueMath."""
    return OPS if math.intrinsics else OP_CPP


def calls_gelu_phi(g: GemmPlan, math: EpilogueMath) -> bool:
    """Whether the epilogue of `g` calls gelu_phi (its .cu then carries
    templates/sm90/epilogue_math.inc.j2)."""
    return math.intrinsics and _applies(g, Op.GELU)


def _applies(g: GemmPlan, op: Op) -> bool:
    return any(isinstance(n.kind, Apply) and n.kind.op is op for n in g.epilogue.nodes)


def template_values() -> dict:
    """gelu_phi's coefficients, highest power first (Horner's order), as C++ float literals."""
    return dict(gelu_q=[float_literal(c) for c in reversed(GELU_Q)],
                gelu_clamp=float_literal(GELU_CLAMP))
