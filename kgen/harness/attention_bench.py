"""`kgen run --bench` on an attention program: torch's SDPA backends (cuDNN, flash, memory-
efficient) and FlexAttention (torch.compile'd), timed on the same inputs in the same run.

A program is attention-shaped when its loop is `s = Q @ K^T` then `o += s @ V` over parameters
with batch and heads ([B, H, S, D]; K and V may have fewer heads: GQA). The baselines compute
softmax(scale * Q K^T) V, causal (top-left: `col <= row`, SDPA's is_causal) when the plan's only
bound is that one, else without a mask; other score or mask terms of the program are not in
them, which a note says. A baseline that cannot run (a backend missing on this GPU or for these
shapes, torch.compile failing) is a note, never a failure: the baselines are informative.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .. import ir
from ..plan import program as pp

CAUSAL = (pp.ColumnBound(True, False, 1, ()),)
BACKENDS = (("SDPA cuDNN", "CUDNN_ATTENTION"), ("SDPA flash", "FLASH_ATTENTION"),
            ("SDPA efficient", "EFFICIENT_ATTENTION"))


@dataclass(frozen=True, slots=True)
class AttentionCall:
    """How SDPA computes the program's shape: its Q, K, V parameters and the mask it takes."""

    q: str
    k: str
    v: str
    causal: bool


def attention_call(kernel: ir.Kernel, plan: Any) -> AttentionCall | None:
    """The SDPA call for an attention-shaped loop program, or None."""
    loop = kernel.loop
    if loop is None or not isinstance(plan, pp.LoopPlan) or len(loop.gemms) != 2:
        return None
    first, second = loop.gemms
    if not first.b.transposed or second.a.name != first.name or second.b.transposed:
        return None
    names = (first.a.name, first.b.name, second.b.name)
    params = [kernel.param(n) for n in names]
    if any(p is None or p.batch is None or p.heads is None for p in params):
        return None
    return AttentionCall(*names, causal=plan.bounds.bounds == CAUSAL)


def time_baselines(call: AttentionCall, sets: list[Mapping[str, Any]],
                   time: Callable[[Callable[[int], None]], Any], say: Callable[[str], None]
                   ) -> tuple[dict[str, Any], list[str]]:
    """Each baseline's Timing (by name) on the argument `sets` in turn, with `time(fn)`
    timing fn(i) as kgen's run is timed; and the notes."""
    import torch
    import torch.nn.functional as F

    notes = [f"the SDPA and FlexAttention baselines compute softmax(QK^T / sqrt(D)) V"
             f"{', causal (top-left)' if call.causal else ''}: the program's other score and "
             "mask terms, if any, are not in them"]
    tensors = [(args[call.q], args[call.k], args[call.v]) for args in sets]
    gqa = tensors[0][0].shape[1] != tensors[0][1].shape[1]
    timings: dict[str, Any] = {}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as err:
        return timings, notes + [f"SDPA backends not selectable: {err}"]
    for name, backend in BACKENDS:
        say(f"benchmarking {name} on the same data")
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                def run(i: int) -> None:
                    q, k, v = tensors[i]
                    F.scaled_dot_product_attention(q, k, v, is_causal=call.causal,
                                                   enable_gqa=gqa)

                timings[name] = time(run)
        except Exception as err:  # a backend this GPU or these shapes do not have
            notes.append(f"{name} baseline failed: {type(err).__name__}: {_first_line(err)}")
    say("benchmarking FlexAttention (torch.compile) on the same data")
    try:
        timings["FlexAttention"] = time(_flex(torch, tensors, call.causal, gqa))
    except Exception as err:
        notes.append(f"FlexAttention baseline failed: {type(err).__name__}: "
                     f"{_first_line(err)}")
    return timings, notes


def _flex(torch, tensors, causal: bool, gqa: bool) -> Callable[[int], None]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    q, k, _ = tensors[0]
    block_mask = None
    if causal:
        block_mask = create_block_mask(lambda b, h, row, col: col <= row, B=None, H=None,
                                       Q_LEN=q.shape[2], KV_LEN=k.shape[2], device=q.device)

    def run(i: int) -> None:
        a, b, c = tensors[i]
        compiled(a, b, c, block_mask=block_mask, enable_gqa=gqa)

    run(0)  # compiles here, before the timing's warm-up
    return run


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else ""
