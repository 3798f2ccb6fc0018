"""The sm_90a skeleton of a loop kernel (templates/sm90/loop.cu.j2): warp-specialized, wgmma,
the copy engine's rings; filled from a plan.program.LoopPlan whose `wgmma` schedule the
rulebook chose. The statements are the plan's, rendered by the same macros as the mma.sync
skeleton's (templates/common/program_statements.inc.j2): the wgmma accumulator's fragments
hold the same rows and columns per thread as mma.sync's n8 tiles side by side, so only the
MMAs, the loads and the thread-to-row map differ."""
from __future__ import annotations

from ...plan import program as pp
from ..common.arch_guard import guard_for
from ..common.loop import (FAST_EXP_OF_DIFFERENCE, FAST_EXP_OPS, CStatement, _aligned,
                           _bounds, _fields, _header, _loop_chunks, _params_guard, approx_tanh,
                           body_ops, literal, reciprocal_division, statements, unmasked,
                           uses_random)
from ..common.render import render
from .tensor_map import TMA_DTYPE


def emit_loop(plan: pp.LoopPlan, *, source_name: str, source_hash: str, command: str) -> str:
    assert plan.wgmma is not None, "the mma.sync skeleton's plan"
    assert not plan.wgmma.pingpong or (plan.wgmma.issue_ahead and plan.wgmma.consumers >= 2), \
        "ping-pong takes turns at the issue points of the overlapped skeleton, 2+ consumers"
    # exp on the MUFU's ex2 as every loop skeleton spells it (common/loop.py's FAST_EXP_OPS):
    # e^(a - b) one multiply-add and the ex2, as FlashAttention-3's softmax
    ops = FAST_EXP_OPS
    staged = plan.wgmma.staged_tile
    # the staged tile's pairs at the thread's elements (the template's load_staged)
    tiles = {staged.param: "pair_elem(Element(), staged[j][e >> 1], e & 1)"} if staged else None
    body = statements(plan.body, "loop_len", fold=plan.bounds.fold, ops=body_ops(plan, ops),
                      exp_of_difference=FAST_EXP_OF_DIFFERENCE, scaled_exp=True, tiles=tiles,
                      reciprocal=reciprocal_division(plan), unmask=unmasked(plan),
                      vote=plan.wgmma.vote)
    if plan.wgmma.issue_ahead:
        body = _with_drain(body)
    tail = statements(plan.epilogue, "kN1", acc="acc1", ops=ops,
                      exp_of_difference=FAST_EXP_OF_DIFFERENCE, scaled_exp=True,
                      reciprocal=reciprocal_division(plan))
    # an output among the maps leaves through shared memory and the copy engine (loop_schedule's
    # with_o_store; one CTA per tile: Q's buffer, where it is staged, is not loaded again)
    o_map = next((m for m in plan.wgmma.maps if plan.param(m.param).role.value == "out"), None)
    assert o_map is None or not plan.wgmma.persistent, "staged in Q's buffer: tiled only"
    return render(
        "sm90/loop.cu.j2", plan=plan, name=plan.name, ns=f"{plan.name}_cfg",
        header=_header(plan, source_name, source_hash, command),
        arch_guard=guard_for(plan.name, plan.arch, wgmma=True),
        fields=_fields(plan), params_guard=_params_guard(plan), body=body, tail=tail,
        aligned=_aligned(plan), loop_chunks=_loop_chunks(plan), element=plan.dtype.cpp,
        mma_ab=plan.dtype.dsl_name, block=plan.block, n1=plan.gemm1.n, bounds=_bounds(plan),
        listed=plan.bounds.listed,
        carries=[(name, literal(init)) for name, init in plan.carries],
        # what the consumers address directly: outputs, vectors and the tensors the statements
        # read at (row, col) (the copy engine reads the operands through their maps)
        pointers=[p for p in plan.params
                  if p.kind == "vector" or (p.kind == "tensor" and (
                      (p.role.value == "out" and (o_map is None or p.name != o_map.param))
                      or (p.role.value != "out" and p.name not in {m.param for m in plan.wgmma.maps})))],
        tensor_maps=plan.wgmma.maps, tma_dtype=TMA_DTYPE[plan.dtype],
        persistent_grid=plan.wgmma.persistent, o_map=o_map, philox=uses_random(plan),
        approx_tanh=approx_tanh(plan))



# the statements that touch the accumulator or the handed-on value (registers the previous
# block's accumulating gemm, still in flight, reads and writes)
TOUCH_IN_FLIGHT = ("rescale", "hand_on")


def _with_drain(body: list[CStatement]) -> list[CStatement]:
    """The body with the skeleton's wait for the previous block's accumulating gemm ("drain")
    before the first statement that touches its registers."""
    first = next(i for i, s in enumerate(body) if s.kind in TOUCH_IN_FLIGHT or (
        s.kind == "mma" and s.gemm.accumulate))
    return body[:first] + [CStatement("drain")] + body[first:]
