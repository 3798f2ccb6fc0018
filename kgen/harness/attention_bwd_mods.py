"""The attention backward with the forward's mods (kgen/attention_grad_mods.py) against the plain
backward and against FlexAttention's backward with the same mods, on the GPU. bf16, 16k tokens,
hidden 2048 (D 128: 16 heads, S 4096: batch 4); CUDA events, median of 15.

Columns: `ms` the backward sequence kgen.attention runs (D, the main kernel, the dQ conversion)
called as a torch op on made-up O and lse, each mod beside the plain backward of the same causal
setting (`x plain`); `grad ms` torch.autograd.grad of a saved kgen.attention graph (the real
forward's O and lse; the mods' tensors prepared per call as a user's backward prepares them: the
bias as the backward takes it, its gradient summed); `Flex ms` the same for
torch.compile(flex_attention) with the same mods (kgen/harness/flex_mods.py; the masks as a
BlockMask made outside the timing; the bias's gradient by a captured buffer that requires grad);
`Flex/kgen` Flex's grad ms over kgen's. `graph ms` and `Flex gr` the same grads captured in CUDA
graphs and replayed (the GPU's time, without either side's host preparation), and their
`Flex/kgen`. Each mod's Flex gradients are checked against kgen's on the first call (the largest
relative difference over dQ, dK, dV and dBias, `grad diff`; past GRAD_TOL the row is flagged and
the run exits 1). Where Flex cannot express a mod (NO_FLEX) its cells are empty.

    python3 bench/attention_bwd.py --mods [--d 128] [--s 4096] [--arch sm_80] [--json FILE]
    python3 bench/attention_bwd.py --mods --no-flex # kgen's sequence only (the `ms` column)
    python3 bench/attention_bwd.py --mods --only softcap "bias grad" --json a.json  # some rows
    python3 bench/attention_bwd.py --mods --from-json a.json b.json  # rows of runs joined (CPU)
    python3 bench/attention_bwd.py --mods --once    # one small call per mod, no timing (for
                                                    # compute-sanitizer; --only NAME: one)
    python3 bench/attention_bwd.py --mods --compile # only build and load them (NVRTC cache)
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from ..attention import _arch
from ..attention_grad import BackwardSignature, _backward_op
from ..attention_grad_mods import Mods, bias_layout, bias_t
from . import flex_mods
from .timing import call_median_ms

TOKENS, HIDDEN = 16384, 2048
WINDOW = 1024
MODS = {  # name: (causal, Mods, scalars)
    "plain": (False, Mods(), {}),
    "plain causal": (True, Mods(), {}),
    "softcap": (False, Mods(score_mod="cap * tanh(score / cap)", scalars=("cap",)),
                {"cap": flex_mods.SOFTCAP}),
    "softcap causal": (True, Mods(score_mod="cap * tanh(score / cap)", scalars=("cap",)),
                       {"cap": flex_mods.SOFTCAP}),
    "alibi": (False, Mods(score_mod="score - slopes[head] * (row - col)",
                          vectors=(("slopes", "head"),)), {}),
    "alibi causal": (True, Mods(score_mod="score - slopes[head] * (row - col)",
                                vectors=(("slopes", "head"),)), {}),
    f"window {WINDOW} causal": (True, Mods(mask_mod="col > row - window", scalars=("window",)),
                                {"window": float(WINDOW)}),
    "document": (False, Mods(mask_mod="qd[row] == kd[col]",
                             vectors=(("kd", "col"), ("qd", "row"))), {}),
    "dropout 0.1": (False, Mods(dropout=True), {"seed": 5, "offset": 8, "dropout_p": 0.1,
                                                 "dropout_scale": 1 / 0.9}),
    "bias": (False, Mods(bias="tensor"), {}),
    "bias grad": (False, Mods(bias="tensor", bias_grad=True), {}),
    "bias grad causal": (True, Mods(bias="tensor", bias_grad=True), {}),
}
# Each row's FlexAttention mod (kgen/harness/flex_mods.py), by its name without " causal"
FLEX = {"plain": "plain", "softcap": "softcap", "alibi": "alibi", f"window {WINDOW}": "window",
        "document": "document", "bias": "bias", "bias grad": "bias"}
# The rows Flex cannot express, and why (their Flex cells stay empty)
NO_FLEX = {"dropout 0.1": "FlexAttention's score_mod changes a score before the softmax; "
                          "dropout zeroes probabilities after it, which no score_mod or "
                          "mask_mod spells"}
GRAD_TOL = 2e-2  # Flex's gradients against kgen's: relative (Frobenius) difference, bf16 both
# issue 52: Flex's backward time over kgen's with the same mods
TARGET_GEOMEAN, TARGET_LOWEST = 1.4, 1.1


def flex_mod(name: str) -> str | None:
    """The FlexAttention mod of row `name` (None: one Flex cannot express, NO_FLEX)."""
    return FLEX.get(name.removesuffix(" causal"))


def _inputs(sig: BackwardSignature, b: int, h: int, s: int, scalars: dict) -> dict:
    import torch

    d = sig.d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do, o = (torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
                      for _ in range(5))
    lse = torch.full((b, h, s), math.log(s) + 1.0, device="cuda")  # P about e^-1 / S
    given = {"dO": do, "O": o, "Q": q, "K": k, "V": v, "lse": lse, "scale": 1 / math.sqrt(d),
             **scalars}
    m = sig.mods
    if m.bias == "tensor":
        given["BiasT"] = bias_t(torch.randn(1, h, s, s, device="cuda", generator=gen).bfloat16(),
                                q, k, bias_layout(sig))
    for name, index in m.vectors:
        if index == "head":
            given[name] = torch.rand(h, device="cuda") * 0.1
        else:  # 8 documents per sequence
            ids = (torch.arange(s, device="cuda") * 8 // s).float()
            given[name] = ids.expand(b, h, s)
    return given


def _call(sig: BackwardSignature, given: dict):
    import torch

    op, inputs, _ = _backward_op(sig, torch.cuda.current_device())
    args = [given[name] for name in inputs]
    return lambda: op(*args)


def _median_ms(fn, reps: int = 15) -> float:
    return call_median_ms(fn, reps, warmups=1)


def graph_inputs(name: str, b: int, h: int, s: int, d: int, device="cuda") -> tuple:
    """q, k, v (requiring grad), dO and the mod's tensor of row `name`, seeded: ALiBi's slopes
    [H], the document ids [B, S] (8 documents per sequence), the bias [1, H, S, S] (requiring
    grad in the `bias grad` rows); None for the others."""
    import torch

    mods = MODS[name][1]
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, device=device, generator=gen).bfloat16()
                   for _ in range(4))
    extra = None
    if mods.bias:
        extra = torch.randn(1, h, s, s, device=device, generator=gen).bfloat16()
        extra.requires_grad_(mods.bias_grad)
    elif mods.vectors and mods.vectors[0][1] == "head":
        extra = torch.rand(h, device=device, generator=gen) * 0.1
    elif mods.vectors:
        extra = (torch.arange(s, device=device) * 8 // s).float().expand(b, s).contiguous()
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do, extra


def kgen_options(name: str, extra) -> dict:
    """kgen.attention's keyword options for row `name`, its mod's tensor `extra` given."""
    causal, mods, scalars = MODS[name]
    options = {"is_causal": causal, "score_mod": mods.score_mod, "mask_mod": mods.mask_mod,
               "scalars": {n: scalars[n] for n in mods.scalars} or None,
               "vectors": {n: extra for n, _ in mods.vectors} or None,
               "attn_mask": extra if mods.bias else None}
    if mods.dropout:
        options.update(dropout_p=scalars["dropout_p"],
                       dropout_rng=(scalars["seed"], scalars["offset"]))
    return options


def flex_forward(name: str, q, k, v, extra, flex=None):
    """FlexAttention's forward with row `name`'s mod, as a call (the BlockMask made here, once):
    `flex` the flex_attention to call, torch.compile's by default."""
    causal, mod = MODS[name][0], flex_mod(name)
    score = flex_mods.score_mod(mod, extra)
    masks = flex_mods.mask_mods(mod, causal, extra, WINDOW)
    block_mask = flex_mods.block_mask(masks, mod, q.shape[0], q.shape[2], k.shape[2],
                                      device=q.device)
    flex = flex or flex_mods.compiled()
    return lambda: flex(q, k, v, score_mod=score, block_mask=block_mask)


def _grad(forward, leaves, do):
    """The forward called once, its graph kept: a call of torch.autograd.grad on it."""
    import torch

    out = forward()
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def _graph_grad(make_forward, tensors: tuple, do):
    """torch.autograd.grad of a forward's output captured in a CUDA graph, as a call timing
    REPLAYS replays of it back to back (the GPU's time, no host preparation between).
    `make_forward(q, k, v, extra)` the forward's call on these tensors; `tensors` (q, k, v,
    extra), detached here into fresh leaves on a side stream (a leaf used before keeps its
    first stream, which the end of a backward waits on), the forward run there, where the
    backward's kernels follow it into the capture; two warm-up calls there first (loads,
    allocations, Flex's compiled backward)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fresh = [None if x is None else x.detach().requires_grad_(x.requires_grad)
                 for x in tensors]
        leaves = tuple(x for x in fresh if x is not None and x.requires_grad)
        out = make_forward(*fresh)()
        for _ in range(2):
            torch.autograd.grad(out, leaves, do, retain_graph=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        torch.autograd.grad(out, leaves, do, retain_graph=True)

    def replays():
        for _ in range(REPLAYS):
            graph.replay()
    return replays


REPLAYS = 5  # replays per timed call of a captured backward (its ms: the call's / REPLAYS)


def _graph_ms(make_forward, tensors: tuple, do) -> float:
    return _median_ms(_graph_grad(make_forward, tensors, do)) / REPLAYS


def relative_difference(got, want) -> float:
    """The largest relative (Frobenius) difference between the tensors of `got` and `want`."""
    return max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
               for a, b in zip(got, want))


def autograd_columns(name: str, b: int, h: int, s: int, d: int, flex: bool = True) -> dict:
    """Row `name`'s backward by torch.autograd.grad: kgen.attention's (`kgen_grad_ms`; replayed
    from a CUDA graph, `kgen_graph_ms`) and, with `flex`, FlexAttention's on the same inputs
    (`flex_ms`, `flex_graph_ms`), its gradients checked against kgen's on the first call
    (`grad_diff`); `flex_note` why a Flex cell is empty."""
    import kgen

    q, k, v, do, extra = graph_inputs(name, b, h, s, d)
    leaves = (q, k, v) + ((extra,) if MODS[name][1].bias_grad else ())

    def kgen_forward(q, k, v, extra):
        return lambda: kgen.attention(q, k, v, **kgen_options(name, extra))
    kgen_grad = _grad(kgen_forward(q, k, v, extra), leaves, do)
    want = kgen_grad()
    row = {"kgen_grad_ms": _median_ms(kgen_grad), "flex_ms": None, "grad_diff": None,
           "flex_note": None, "kgen_graph_ms": _graph_ms(kgen_forward, (q, k, v, extra), do),
           "flex_graph_ms": None}
    if not flex:
        return row
    if flex_mod(name) is None:
        row["flex_note"] = NO_FLEX[name]
        return row
    try:
        flex_grad = _grad(flex_forward(name, q, k, v, extra), leaves, do)
        row["grad_diff"] = relative_difference(flex_grad(), want)  # compiles here
        row["flex_ms"] = _median_ms(flex_grad)
        row["flex_graph_ms"] = _graph_ms(lambda *t: flex_forward(name, *t), (q, k, v, extra),
                                         do)
    except Exception as err:  # torch.compile, Flex or its capture failing: a note, row kept
        lines = str(err).strip().splitlines()
        row["flex_note"] = f"{type(err).__name__}: {lines[0][:160] if lines else ''}"
    return row


def ratios(row: dict) -> dict:
    """Flex's time over kgen's of a row's autograd columns: `flex_over_kgen` around the call
    (what a user sees, each side's host preparation inside), `flex_over_kgen_graph` replayed
    from CUDA graphs (the GPU's time alone); None where a side is missing."""
    def over(a, b):
        return row[a] / row[b] if row.get(a) and row.get(b) else None
    return {"flex_over_kgen": over("flex_ms", "kgen_grad_ms"),
            "flex_over_kgen_graph": over("flex_graph_ms", "kgen_graph_ms")}


def _cell(x, width: int, form: str) -> str:
    return f"{x:{width}{form}}" if x is not None else f"{'-':>{width}}"


HEADER = (f"{'mod':20s} {'ms':>8} {'TFLOP/s':>8} {'x plain':>8} {'grad ms':>8} {'Flex ms':>8} "
          f"{'Flex/kgen':>9} {'graph ms':>8} {'Flex gr':>8} {'Flex/kgen':>9} {'grad diff':>9}")


def format_row(row: dict) -> str:
    """One line of the table (an empty cell is `-`; a grad diff past GRAD_TOL is flagged)."""
    flag = "  DIFFERS" if row.get("grad_diff") is not None and row["grad_diff"] > GRAD_TOL \
        else ""
    return (f"{row['mod']:20s} {_cell(row['ms'], 8, '.3f')} {_cell(row['tflops'], 8, '.1f')} "
            f"{_cell(row['vs_plain'], 8, '.2f')} {_cell(row.get('kgen_grad_ms'), 8, '.3f')} "
            f"{_cell(row.get('flex_ms'), 8, '.3f')} {_cell(row.get('flex_over_kgen'), 9, '.2f')} "
            f"{_cell(row.get('kgen_graph_ms'), 8, '.3f')} "
            f"{_cell(row.get('flex_graph_ms'), 8, '.3f')} "
            f"{_cell(row.get('flex_over_kgen_graph'), 9, '.2f')} "
            f"{_cell(row.get('grad_diff'), 9, '.1e')}{flag}")


def summary(rows: list[dict]) -> list[str]:
    """The lines after the table: Flex/kgen's geometric mean over the mods' rows (the plain ones
    left out; with them beside it) and the lowest, against issue 52's targets, around the call
    and then replayed from CUDA graphs; then each empty Flex cell's reason and the rows whose
    gradients differ."""
    lines = []
    for key, what in (("flex_over_kgen", "grad ms"), ("flex_over_kgen_graph", "graph ms")):
        ratios_ = [(r["mod"], r[key]) for r in rows if r.get(key)]
        mods = [(name, x) for name, x in ratios_ if not name.startswith("plain")]
        if not mods:
            continue
        lowest = min(mods, key=lambda nx: nx[1])
        mean = _geomean([x for _, x in mods])
        met = mean >= TARGET_GEOMEAN and lowest[1] >= TARGET_LOWEST
        lines += [f"# Flex/kgen ({what}) over the {len(mods)} mods' rows: geomean {mean:.2f}, "
                  f"lowest {lowest[1]:.2f} ({lowest[0]}); with the plain rows: geomean "
                  f"{_geomean([x for _, x in ratios_]):.2f}",
                  f"# issue 52 (geomean >= {TARGET_GEOMEAN}x, none below {TARGET_LOWEST}x), "
                  f"{what}: {'met' if met else 'not met'}"]
    lines += [f"# {r['mod']}: no Flex cell: {r['flex_note']}" for r in rows if r.get("flex_note")]
    differ = [r["mod"] for r in rows if r.get("grad_diff") is not None and
              r["grad_diff"] > GRAD_TOL]
    if differ:
        lines.append(f"# Flex's gradients differ from kgen's past {GRAD_TOL}: {', '.join(differ)}")
    return lines


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/attention_bwd.py --mods")
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--s", type=int, default=4096)
    parser.add_argument("--arch", default=None, help="the `ms` column's target (the device's "
                        "by default; the grad and Flex columns are always the device's)")
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--only", nargs="+", default=None, choices=list(MODS), metavar="NAME",
                        help=f"only these rows (of {', '.join(MODS)})")
    parser.add_argument("--no-flex", action="store_true", help="kgen's sequence only (no "
                        "autograd columns, no torch.compile of Flex)")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("--compile", action="store_true", help="build and load every "
                        "backward (the NVRTC cache), no call")
    parser.add_argument("--from-json", nargs="+", default=None, metavar="FILE",
                        help="no GPU: the table and summary of the rows of these --json files "
                             "(runs of some rows each, --only, joined)")
    return parser.parse_args(argv)


def report(rows: list[dict]) -> list[str]:
    """The table's header, its rows and the summary."""
    return [HEADER, *(format_row(r) for r in rows), *summary(rows)]


def main(argv=None) -> None:
    args = parse(argv)
    if args.from_json:
        rows = []
        for path in args.from_json:
            with open(path) as f:
                rows += json.load(f)
        print("\n".join(report(rows)))
        return
    import torch

    arch = args.arch or _arch(torch.device("cuda"))
    names = [n for n in MODS if args.only is None or n in args.only]
    if args.compile:
        for d in (64, args.d):
            for causal, mods, _ in MODS.values():
                _backward_op(BackwardSignature("bf16", d, causal, arch, mods=mods),
                             torch.cuda.current_device())
        return
    if args.once:
        for name in names:
            causal, mods, scalars = MODS[name]
            sig = BackwardSignature("bf16", 64, causal, arch, mods=mods)
            _call(sig, _inputs(sig, 1, 2, 304, scalars))()  # S: a multiple of 8 (dBiasT)
            torch.cuda.synchronize()
            print(f"{name}: ran")
        return
    h = HIDDEN // args.d
    b = TOKENS // args.s
    base = {}
    print(f"# {torch.cuda.get_device_name()}, D {args.d} S {args.s} batch {b} heads {h}, bf16; "
          f"ms: kgen's sequence ({arch}), x plain: over the plain backward of the same causal "
          "setting; grad ms, Flex ms: torch.autograd.grad of a saved kgen.attention / "
          "torch.compile(flex_attention) graph (events around the call); graph ms, Flex gr: "
          "the same grad replayed from a CUDA graph (the GPU's time); grad diff: Flex's "
          "gradients against kgen's")
    print(HEADER)
    rows = []
    for name in names:
        causal, mods, scalars = MODS[name]
        sig = BackwardSignature("bf16", args.d, causal, arch, mods=mods)
        ms = _median_ms(_call(sig, _inputs(sig, b, h, args.s, scalars)))
        flops = 2.5 * 4 * b * h * args.s * args.s * args.d / (2 if causal else 1)
        if name.startswith("plain"):
            base[causal] = ms
        row = {"mod": name, "causal": causal, "d": args.d, "s": args.s, "batch": b, "heads": h,
               "ms": ms, "tflops": flops / ms / 1e9,
               "vs_plain": ms / base[causal] if causal in base else None}
        if not args.no_flex:
            row.update(autograd_columns(name, b, h, args.s, args.d))
            row.update(ratios(row))
        rows.append(row)
        print(format_row(row), flush=True)
        torch.cuda.empty_cache()
    print("\n".join(summary(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if any(r.get("grad_diff") is not None and r["grad_diff"] > GRAD_TOL for r in rows):
        sys.exit(1)
