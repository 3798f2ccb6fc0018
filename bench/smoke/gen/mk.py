from kgen import ir
from kgen.lower import lower
from kgen.emit import emit
import sys
def kern(dt=ir.DType.F16, a_layout=ir.Layout.ROW, b_layout=ir.Layout.COL, tile=(128,256,64), warps=(2,4), stages=3, relu=True, arch=ir.Arch.SM80):
    P=ir.Param; T=ir.ParamKind.TENSOR
    params=(P("A",T,dt,("M","K"),a_layout), P("B",T,dt,("K","N"),b_layout), P("C",T,dt,("M","N")),
            P("D",T,dt,("M","N"),role=ir.Role.OUT), P("bias",ir.ParamKind.VECTOR,ir.DType.F32,("N",)),
            P("alpha",ir.ParamKind.SCALAR,ir.DType.F32,default=1.5), P("beta",ir.ParamKind.SCALAR,ir.DType.F32,default=0.5))
    e = ir.Call(ir.Op.ADD,(ir.Call(ir.Op.ADD,(ir.Call(ir.Op.MUL,(ir.ScalarLoad("alpha"),ir.Acc())), ir.Call(ir.Op.MUL,(ir.ScalarLoad("beta"),ir.TensorLoad("C"))))), ir.VectorLoad("bias",ir.Axis.COL)))
    if relu: e = ir.Call(ir.Op.RELU,(e,))
    g=ir.Gemm("mma0",ir.OperandRef("A"),ir.OperandRef("B"),ir.DType.F32,ir.TileShape(*tile),ir.WarpGrid(*warps),ir.StageCount(stages),ir.Epilogue((ir.Store("D",e),)))
    return ir.Kernel("gemm_bias_relu",arch,params,(g,))
if __name__=="__main__":
    k=kern()
    plan=lower(k)
    src=emit(plan,source_name="x.kg",source_hash="abc",command="kgen compile x.kg")
    open("/tmp/kt/k.cu","w").write(src)
    print(len(src))
