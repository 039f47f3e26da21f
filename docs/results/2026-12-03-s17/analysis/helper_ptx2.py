import re, importlib.util, os, tempfile, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
def make(expr):
    code = f'''import triton, triton.language as tl
from torch._inductor.runtime import triton_helpers
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
@triton.jit
def k(x, y, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    v = tl.load(x + i)
    w = {expr}
    tl.store(y + i, w)
'''
    f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, dir="/tmp/s17"); f.write(code); f.close()
    spec = importlib.util.spec_from_file_location(os.path.basename(f.name)[:-3], f.name)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m.k
def ptx(expr):
    k = triton.compile(ASTSource(fn=make(expr), signature={"x": "*fp32", "y": "*fp32", "XBLOCK": "constexpr"}, constexprs={"XBLOCK": 128}), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    p = k.asm["ptx"]; body = p[p.find("{", p.find(".entry")):]
    return [l.strip() for l in body.splitlines() if l.strip().endswith(";") and not l.strip().startswith((".", "//"))]
base = len(ptx("v"))
for e in ["libdevice.exp(v)", "libdevice.tanh(v)", "libdevice.log1p(v)", "tl_math.cos(v)", "tl_math.sin(v)", "libdevice.rsqrt(v)", "libdevice.erf(v)"]:
    ins = ptx(e)
    br = [l for l in ins if "bra" in l]
    print(f"{e:22} {len(ins)-base:4} branches {len(br)}")
