"""Issue 52's training step: a small decoder (token and position embeddings, pre-norm layers of
causal attention and a GELU MLP, an LM head) trained on random tokens with kgen.attention as the
attention, beside the same model with torch SDPA. Every run starts from the same initial weights
and sees the same batches: each sequence a random half repeated (its second half predictable by
attending back; the first half's loss stays at log(vocab)). bf16 autocast over f32 weights, AdamW
with a linear warm-up, gradients clipped at 1.

Runs: `sdpa_flash`, `sdpa_cudnn` and `sdpa_math` (scaled_dot_product_attention(is_causal=True)
with the backend forced), `kgen` (kgen.attention(q, k, v, is_causal=True), its backward kgen's);
with --compile, `sdpa_flash+compile` and `kgen+compile` (torch.compile of the model). Per-step
time: CUDA events around each step (forward, backward, optimizer), the median after WARM_UP
steps. The loss curves are compared with sdpa_flash's: the largest absolute difference over the
steps and the difference at the last step. The yardstick is the bf16 noise band: sdpa_math
(f32 softmax) against sdpa_flash (bf16 probabilities) differ by rounding only; the kgen curve
passes within MULTIPLE times that band.

    bash .gpu/device-run.sh python3 bench/train_step.py [--steps 300] [--json $OUT/train.json]
        [--compile] [--runs sdpa_flash sdpa_math kgen] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

RUNS = ("sdpa_flash", "sdpa_cudnn", "sdpa_math", "kgen")
COMPILED = ("sdpa_flash+compile", "kgen+compile")
REFERENCE, NOISE = "sdpa_flash", "sdpa_math"  # the curve compared against; the band's other end
MULTIPLE = 3.0  # the kgen curve's difference may be this many times the bf16 noise band
WARM_UP = 10  # steps left out of the time's median (2 with --quick)
CURVE_POINTS = 11  # the loss curve printed at this many steps


@dataclass(frozen=True)
class Config:
    layers: int = 4
    d_model: int = 1024
    heads: int = 8  # of d_model / heads = 128
    mlp: int = 4  # the MLP's hidden size over d_model
    seq: int = 4096
    batch: int = 4
    vocab: int = 4096
    lr: float = 1e-3
    warmup: int = 20  # the learning rate's linear warm-up, steps
    seed: int = 0


class Layer(nn.Module):
    def __init__(self, cfg: Config, attend):
        super().__init__()
        d = cfg.d_model
        self.heads, self.attend = cfg.heads, attend
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, cfg.mlp * d, bias=False)
        self.down = nn.Linear(cfg.mlp * d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, S, D], views of qkv
        x = x + self.out(self.attend(q, k, v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, cfg: Config, attend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.position = nn.Embedding(cfg.seq, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg, attend) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position.weight[:tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def kgen_attention(q, k, v):
    import kgen

    return kgen.attention(q, k, v, is_causal=True)


def run_setup(name: str):
    """The attention function and the context (an SDPA backend forced, or none) of run `name`,
    and whether it compiles the model."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    base, _, compiled = name.partition("+")
    if base == "kgen":
        return kgen_attention, contextlib.nullcontext, bool(compiled)
    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_math": SDPBackend.MATH}[base]
    return sdpa, lambda: sdpa_kernel(backend), bool(compiled)


def batches(cfg: Config, steps: int, device) -> torch.Tensor:
    """[steps, batch, seq] tokens, seeded: each sequence a random half, repeated."""
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    half = torch.randint(cfg.vocab, (steps, cfg.batch, cfg.seq // 2), generator=gen,
                         device=device)
    return torch.cat([half, half], dim=2)


def initial_state(cfg: Config, device) -> dict:
    torch.manual_seed(cfg.seed)
    model = Model(cfg, sdpa).to(device)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(cfg: Config, attend, state: dict, data: torch.Tensor, context=contextlib.nullcontext,
          compile_model: bool = False) -> tuple[list[float], list[float]]:
    """The losses of each step and, on a GPU, each step's milliseconds (CUDA events)."""
    device = data.device
    model = Model(cfg, attend).to(device)
    model.load_state_dict(state)
    forward = torch.compile(model) if compile_model else model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / cfg.warmup))
    cuda = device.type == "cuda"
    losses, events = [], []
    with context():
        for tokens in data:
            if cuda:
                events.append((torch.cuda.Event(enable_timing=True),
                               torch.cuda.Event(enable_timing=True)))
                events[-1][0].record()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = forward(tokens)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            schedule.step()
            if cuda:
                events[-1][1].record()
            losses.append(loss.detach())
    if cuda:
        torch.cuda.synchronize()
    return torch.stack(losses).tolist(), [a.elapsed_time(b) for a, b in events]


def flops(cfg: Config) -> tuple[float, float]:
    """(attention's, the whole step's) flops: forward and backward (3x a matmul's forward, the
    attention's backward 2.5x its forward), attention causal (half the scores)."""
    tokens, d = cfg.batch * cfg.seq, cfg.d_model
    attention = 3.5 * 2 * cfg.batch * cfg.heads * cfg.seq ** 2 * (d // cfg.heads) * cfg.layers
    matmuls = 6 * tokens * (cfg.layers * (4 + 2 * cfg.mlp) * d * d + d * cfg.vocab)
    return attention, attention + matmuls


def compare(losses: list[float], reference: list[float]) -> tuple[float, float]:
    """(the largest absolute difference over the steps, the difference at the last step)."""
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    return max(diffs), diffs[-1]


def summarize(results: dict, warm_up: int) -> dict:
    """Per run: the median step time, the first and last losses and the differences from
    REFERENCE's curve; a run that failed keeps its `error`."""
    ref = results.get(REFERENCE, {}).get("losses")
    rows = {}
    for name, r in results.items():
        if "error" in r:
            rows[name] = {"error": r["error"]}
            continue
        times = r["times"][warm_up:] or r["times"]
        row = {"ms": statistics.median(times) if times else None,
               "loss_first": r["losses"][0], "loss_last": r["losses"][-1]}
        if ref and name != REFERENCE:
            row["max_diff"], row["end_diff"] = compare(r["losses"], ref)
        rows[name] = row
    return rows


def verdict(rows: dict) -> tuple[float | None, str]:
    """kgen's largest difference over the noise band's (None without both) and the line."""
    band, kgen = rows.get(NOISE, {}).get("max_diff"), rows.get("kgen", {}).get("max_diff")
    if band is None or kgen is None:
        return None, f"# no verdict: it needs the {REFERENCE}, {NOISE} and kgen runs"
    ratio = kgen / band if band > 0 else float("inf") if kgen > 0 else 0.0
    within = ratio <= MULTIPLE
    return ratio, (f"# bf16 noise band ({NOISE} against {REFERENCE}): max |diff| {band:.4f}, at "
                   f"the end {rows[NOISE]['end_diff']:.4f}\n# kgen against {REFERENCE}: max "
                   f"|diff| {kgen:.4f} = {ratio:.2f}x the band (limit {MULTIPLE:g}x): "
                   f"{'within' if within else 'OUTSIDE'}")


def _cell(x, width: int, form: str) -> str:
    return f"{x:{width}{form}}" if x is not None else f"{'-':>{width}}"


def table(rows: dict) -> list[str]:
    """The runs' table: ms/step, its ratio to REFERENCE's, the first and last losses and the
    curve's differences from REFERENCE's."""
    base = rows.get(REFERENCE, {}).get("ms")
    lines = [f"{'run':20s} {'ms/step':>8} {'x ' + REFERENCE:>13} {'loss[0]':>8} "
             f"{'loss[end]':>9} {'max|diff|':>9} {'|diff| end':>10}"]
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"{name:20s} failed: {row['error']}")
            continue
        ratio = row["ms"] / base if base and row["ms"] else None
        lines.append(f"{name:20s} {_cell(row['ms'], 8, '.2f')} {_cell(ratio, 13, '.3f')} "
                     f"{row['loss_first']:8.4f} {row['loss_last']:9.4f} "
                     f"{_cell(row.get('max_diff'), 9, '.4f')} "
                     f"{_cell(row.get('end_diff'), 10, '.4f')}")
    return lines


def curve(results: dict, points: int = CURVE_POINTS) -> list[str]:
    """The runs' losses at `points` steps spread over the run, a line each."""
    runs = [n for n, r in results.items() if "losses" in r]
    if not runs:
        return []
    steps = len(results[runs[0]]["losses"])
    at = sorted({round(i * (steps - 1) / max(points - 1, 1)) for i in range(points)})
    lines = [f"{'step':>6} " + " ".join(f"{n:>20}" for n in runs)]
    lines += [f"{i:>6} " + " ".join(f"{results[n]['losses'][i]:20.4f}" for n in runs)
              for i in at]
    return lines


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/train_step.py", description=(
        "A small decoder trained with kgen.attention beside torch SDPA: per-step time and the "
        "loss curves against the bf16 noise band (issue 52)."))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="8 steps, a smoke run")
    parser.add_argument("--json", default=None, help="write the curves, times and figures")
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS + COMPILED)
    parser.add_argument("--compile", action="store_true",
                        help="also " + " and ".join(COMPILED) + " (torch.compile of the model)")
    parser.add_argument("--layers", type=int, default=Config.layers)
    parser.add_argument("--seq", type=int, default=Config.seq)
    parser.add_argument("--batch", type=int, default=Config.batch)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    if args.quick:
        args.steps = 8
    if args.compile:
        args.runs = list(dict.fromkeys(args.runs + list(COMPILED)))
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("bench/train_step.py needs a CUDA GPU", file=sys.stderr)
        return 2
    cfg = dataclasses.replace(Config(), layers=args.layers, seq=args.seq, batch=args.batch)
    device = torch.device("cuda")
    attention, total = flops(cfg)
    print(f"# {torch.cuda.get_device_name()}, bf16 autocast (f32 weights, AdamW), {cfg.layers} "
          f"layers, d_model {cfg.d_model}, {cfg.heads} heads of {cfg.d_model // cfg.heads}, MLP "
          f"{cfg.mlp * cfg.d_model}, seq {cfg.seq}, batch {cfg.batch}, vocab {cfg.vocab}; "
          f"{args.steps} steps; attention {100 * attention / total:.0f}% of a step's flops",
          flush=True)
    state, data = initial_state(cfg, device), batches(cfg, args.steps, device)
    results = {}
    for name in args.runs:
        attend, context, compile_model = run_setup(name)
        try:
            losses, times = train(cfg, attend, state, data, context, compile_model)
            results[name] = {"losses": losses, "times": times}
        except Exception as err:  # a backend this GPU lacks, torch.compile failing: a row
            lines = str(err).strip().splitlines()
            results[name] = {"error": f"{type(err).__name__}: {lines[0][:200] if lines else ''}"}
        torch.cuda.empty_cache()
        print(f"# {name} done", flush=True)
    rows = summarize(results, 2 if args.quick else WARM_UP)
    ratio, line = verdict(rows)
    print("\n".join(table(rows) + curve(results) + [line]))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"config": dataclasses.asdict(cfg), "steps": args.steps, "runs": results,
             "rows": rows, "band_ratio": ratio, "multiple": MULTIPLE}, indent=1))
    failed = "error" in results.get("kgen", {}) or (ratio is not None and ratio > MULTIPLE)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
