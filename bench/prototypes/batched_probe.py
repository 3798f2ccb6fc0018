"""Why batched GEMMs run at 0.2-0.86x torch.bmm (bench/RESULTS.md, "Batches"): a diagnostic.

For each shape, the batched example's bare product (D = acc) and its bias epilogue under several
Schedule values (Configs), with a B per batch and with one B broadcast to every batch, beside
torch.bmm on the same operands; the cuBLAS kernels bmm launches, by name (torch.profiler).
Every kgen variant is checked against a float32 reference with its output poisoned first;
timing: CUDA events, the median, inputs rotated past L2.

    bash .gpu/device-run.sh python3 bench/prototypes/batched_probe.py [--shapes 0 1] [--ncu L,M,N,K,VARIANT]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = [(64, 1024, 1024, 512), (512, 256, 256, 128), (4096, 64, 128, 64), (8, 4096, 4096, 1024)]

SOURCE = """
kernel probe {{
  target sm_90a
  tensor A : f16[L, M, K] row
  tensor B : f16[L, K, N] col
  tensor D : f16[L, M, N] row out
  vector bias : f32[L, N]
  scalar alpha : f32 = 1.0
  gemm mma0 = A @ B accumulate f32 {{
    epilogue {{ {epilogue} }}
  }}
}}
"""
EPILOGUES = {"bare": "D = acc", "bias": "D = alpha * acc + bias[col]"}

# --edits: the bias kernel as kgen plans it (its vectors staged in shared memory,
# GemmSchedule.staged_vectors), the same plan with that Schedule value off (every vector read
# from global memory in the epilogue, as before), and a diagnostic edit of the emitted text
# that leaves the bias load out (its values replaced by the accumulator's: the bound, never a
# product variant).
LOAD_OFF = "load_pair<false>(p.bias + col, both)"
EDITS = {"as planned": None, "vectors off": None,
         "no bias load": [(LOAD_OFF, "make_float2(acc_0, acc_1)")]}



def variants():
    from kgen.plan.schedule import KernelKind
    from kgen.targets import Config, GemmConfig

    coop, pp = KernelKind.COOPERATIVE, KernelKind.PINGPONG
    return {
        "coop 128x256 s3": Config((GemmConfig((128, 256, 64), (2, 4), 3),), coop),
        "coop 128x256 s4": Config((GemmConfig((128, 256, 64), (2, 4), 4),), coop),
        "coop 128x192 s4": Config((GemmConfig((128, 192, 64), (2, 4), 4),), coop),
        "coop 128x128 s6": Config((GemmConfig((128, 128, 64), (2, 4), 6),), coop),
        "coop 128x64 s8": Config((GemmConfig((128, 64, 64), (2, 4), 8),), coop),
        "pingpong 128x128 s5": Config((GemmConfig((128, 128, 64), (2, 4), 5),), pp),
        "tiled 64x128 s4": Config((GemmConfig((64, 128, 64), (2, 2), 4),)),
    }


def main() -> int:
    import torch

    import kgen
    from kgen.api import build
    from kgen.emit import emit
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.parse import parse
    from kgen.verify import verify

    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=int, nargs="*", default=list(range(len(SHAPES))))
    parser.add_argument("--variants", nargs="*", default=None)
    parser.add_argument("--epilogues", nargs="*", default=["bare", "bias"])
    parser.add_argument("--edits", action="store_true",
                        help="time the diagnostic edits of the bias kernel instead")
    parser.add_argument("--ncu", default=None, help="L,M,N,K,VARIANT: launch that one 5 times")
    opts = parser.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    stream = torch.cuda.current_stream().cuda_stream
    print("device", props.name, "torch", torch.__version__, "kgen", kgen.__version__)
    kernels = {}
    for name, epilogue in EPILOGUES.items():
        module = parse(SOURCE.format(epilogue=epilogue), f"{name}.kg")
        verify(module)
        kernels[name] = module.kernels[0]
    table = variants()
    loaded = {}

    def kernel_for(epi, vname, edit=None):
        if (epi, vname, edit) not in loaded:
            built = build(kernels[epi], "sm_90a", config=table[vname])
            if edit in ("vectors off", "no bias load"):  # the Schedule value off
                plan = built.plan.with_gemm_schedule(staged_vectors=())
                built = dataclasses.replace(built, plan=plan, source=emit(
                    plan, source_name="probe.kg", source_hash="", command="probe"))
            for old, new in EDITS.get(edit) or []:
                assert built.source.count(old) >= 1, (edit, old)
                built = dataclasses.replace(built, source=built.source.replace(old, new))
            g = built.plan.gemms[0]
            got = f"{built.plan.schedule.kind.value} {'x'.join(map(str, g.tile))} s{g.stages}"
            loaded[epi, vname, edit] = (kgen.api.load_built(built), got)
        return loaded[epi, vname, edit]

    def operands(L, M, N, K, broadcast):
        a = torch.randn(L, M, K, device="cuda").half() / K ** 0.5
        b = (torch.randn(N, K, device="cuda").half().t().expand(L, K, N) if broadcast else
             torch.randn(L, N, K, device="cuda").half().transpose(1, 2))
        return dict(A=a, B=b, bias=torch.randn(L, N, device="cuda"))

    if opts.ncu:
        *dims, vname = opts.ncu.split(",")
        L, M, N, K = map(int, dims)
        ops = operands(L, M, N, K, False)
        d = torch.empty(L, M, N, device="cuda", dtype=torch.float16)
        if vname == "bmm":
            for _ in range(5):
                torch.bmm(ops["A"], ops["B"])
        else:
            k, _ = kernel_for("bare", vname)
            for _ in range(5):
                k(A=ops["A"], B=ops["B"], bias=ops["bias"], D=d, alpha=1.0)
        torch.cuda.synchronize()
        return 0

    l2 = props.L2_cache_size
    for index in opts.shapes:
        L, M, N, K = SHAPES[index]
        flops = 2 * L * M * N * K
        for broadcast in (False, True):
            set_bytes = 2 * L * M * K + 2 * K * N * (1 if broadcast else L) + 2 * L * M * N
            count = 2 if set_bytes > l2 else rotation_count(set_bytes, l2)
            sets = [operands(L, M, N, K, broadcast) for _ in range(count)]
            outs = [torch.empty(L, M, N, device="cuda", dtype=torch.float16) for _ in sets]

            def timed(fn):
                return time_kernel(fn, iters=20, warmup=3,
                                   rotate=rotation_count(set_bytes, l2),
                                   stream=stream).median_ms

            bmm = timed(lambda i: torch.bmm(sets[i % count]["A"], sets[i % count]["B"]))
            dram_mb = set_bytes / 1e6
            print(f"\nL={L} {M}x{N}x{K} B {'broadcast' if broadcast else 'per batch'}: "
                  f"bmm {bmm:.4f} ms ({flops / bmm / 1e9:.0f} TFLOP/s, "
                  f"{dram_mb / bmm / 1e3:.2f} TB/s of the {dram_mb:.0f} MB moved once)")
            if broadcast is False:
                with torch.profiler.profile(
                        activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    torch.bmm(sets[0]["A"], sets[0]["B"])
                    torch.cuda.synchronize()
                names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
                print("  bmm kernels:", "; ".join(sorted(names)))
            first = sets[0]
            want = first["A"].float() @ first["B"].float()
            if opts.edits:
                for vname in (opts.variants or table):
                    for edit in EDITS:
                        k, got = kernel_for("bias", vname, edit)
                        if edit != "no bias load":  # checked before it is timed
                            d = torch.full((L, M, N), float("nan"), device="cuda",
                                           dtype=torch.float16)
                            k(**sets[0], D=d, alpha=0.75)
                            want = 0.75 * (sets[0]["A"].float() @ sets[0]["B"].float()) \
                                + sets[0]["bias"][:, None, :]
                            err = ((d.float() - want).norm() / want.norm()).item()
                            assert err < 1e-2, (vname, edit, err)
                        bound = [k.bind(**s, D=o, alpha=0.75) for s, o in zip(sets, outs)]
                        t = timed(lambda i: k.launch(bound[i % count], stream))
                        print(f"  bias {vname:20s} {edit:14s} {t:.4f} ms {bmm / t:.3f}x bmm")
                continue
            for epi in opts.epilogues:
                ref = want if epi == "bare" else 0.75 * want + first["bias"][:, None, :]
                for vname in (opts.variants or table):
                    try:
                        k, got = kernel_for(epi, vname)
                    except Exception as error:  # a variant the target refuses: say why
                        print(f"  {epi:4s} {vname:20s} refused: {str(error).splitlines()[0]}")
                        continue
                    d = torch.full((L, M, N), float("nan"), device="cuda", dtype=torch.float16)
                    k(**first, D=d, alpha=0.75)
                    torch.cuda.synchronize()
                    err = ((d.float() - ref).norm() / ref.norm()).item()
                    bound = [k.bind(**s, D=o, alpha=0.75) for s, o in zip(sets, outs)]
                    t = timed(lambda i: k.launch(bound[i % count], stream))
                    print(f"  {epi:4s} {vname:20s} {t:.4f} ms {bmm / t:.3f}x bmm "
                          f"{flops / t / 1e9:4.0f} TFLOP/s err {err:.1e} [{got}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
