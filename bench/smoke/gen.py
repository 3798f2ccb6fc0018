"""Generate kernel variants for the C++ smoke harness (GPU correctness + timing without Python)."""
import sys
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "gen"))
from mk import kern
from kgen import ir
from kgen.lower import lower
from kgen.emit import emit
from dataclasses import replace

out = sys.argv[1]
variants = []
def add(tag, **kw):
    k = kern(**kw)
    k = replace(k, name=tag)
    src = emit(lower(k), source_name="smoke", source_hash="0", command="gen.py")
    open(f"{out}/{tag}.cu", "w").write(src)
    variants.append((tag, kw))

F16, BF16 = ir.DType.F16, ir.DType.BF16
R, C = ir.Layout.ROW, ir.Layout.COL
add("v_f16_rc_128x256", dt=F16)
add("v_bf16_rc_128x256", dt=BF16)
add("v_f16_cr_128x256", dt=F16, a_layout=C, b_layout=R)
add("v_f16_rr_128x128", dt=F16, a_layout=R, b_layout=R, tile=(128,128,32), warps=(2,2), stages=4)
add("v_bf16_cc_128x128", dt=BF16, a_layout=C, b_layout=C, tile=(128,128,64), warps=(2,2), stages=3)
add("v_f16_rc_256x128", dt=F16, tile=(256,128,64), warps=(4,2), stages=3)
add("v_f16_rc_128x128_s3", dt=F16, tile=(128,128,64), warps=(2,2), stages=3)
add("v_f16_rc_128x128x32_s4", dt=F16, tile=(128,128,32), warps=(2,2), stages=4)
add("v_f16_rc_128x128x32_s3", dt=F16, tile=(128,128,32), warps=(2,2), stages=3)
add("v_f16_rc_128x256_s4", dt=F16, tile=(128,256,64), warps=(2,4), stages=4, arch=ir.Arch.SM90A)
add("v_f16_rc_256x128_s4", dt=F16, tile=(256,128,64), warps=(4,2), stages=4, arch=ir.Arch.SM90A)
add("v_f16_rc_128x256_k32s5", dt=F16, tile=(128,256,32), warps=(2,4), stages=5)
with open(f"{out}/variants.h", "w") as f:
    for tag, kw in variants:
        f.write(f'#include "{tag}.cu"\n')
    f.write("#define KGEN_VARIANTS(X) \\\n")
    for tag, kw in variants:
        dt = kw.get("dt", F16)
        a_row = kw.get("a_layout", R) is R
        b_col = kw.get("b_layout", C) is C
        f.write(f"  X({tag}, {'__half' if dt is F16 else '__nv_bfloat16'}, {int(a_row)}, {int(b_col)}) \\\n")
    f.write("\n")
