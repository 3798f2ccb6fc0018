"""kgen.attention's mods timed per call (as bench/attention.py --mods: CUDA events around the
Python call, which include the host's preparation) and replayed from a CUDA graph (the GPU's
time alone), D 128 S 4096, 16 heads, 4 batches: plain, document (bench/mods.py's ids), bias,
softcap, and one document (every id equal: nothing skipped, every block inside, the equality's
scan alone). `python3 bench/mods_graph.py` (bench/RESULTS.md section 17)."""
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import torch
from bench.attention import timed
from bench import mods


def graphed(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda").bfloat16() for _ in range(3))
one = torch.zeros(4096, device="cuda")
import kgen
for causal in (False, True):
    runs = {m: mods.kgen_mods_runner(q, k, v, causal, m) for m in ("plain", "document", "bias", "softcap")}
    runs["one document"] = lambda: kgen.attention(q, k, v, is_causal=causal, mask_mod="qd[row] == kd[col]",
                                                  vectors={"qd": one, "kd": one})
    base = None
    for name, fn in runs.items():
        eager = timed(fn)
        replay = timed(graphed(fn))
        base = base or replay
        print(f"causal {causal!s:5} {name:12} per call {eager:.3f} ms  graph replay {replay:.3f} ms  "
              f"replay / plain replay {replay / base:.2f}")
