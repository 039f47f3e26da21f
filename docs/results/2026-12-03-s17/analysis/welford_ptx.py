import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from torch._inductor.runtime import triton_helpers

def count(fn):
    src = ASTSource(fn=fn, signature={"x": "*fp32", "y": "*fp32", "R": "constexpr"}, constexprs={"R": 1024})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = k.asm["ptx"]
    body = ptx[ptx.find("{", ptx.find(".entry")):]
    lines = [l.strip() for l in body.splitlines()]
    return sum(1 for l in lines if l.endswith(";") and not l.startswith((".reg", ".loc", ".file", "//", ".shared", ".global"))), ptx

@triton.jit
def k_sum(x, y, R: tl.constexpr):
    r = tl.arange(0, R)[None, :]
    acc = tl.zeros([1, R], tl.float32)
    for off in tl.range(0, 4096, R):
        v = tl.load(x + off + r)
        acc = acc + v
    tl.store(y + tl.arange(0, 1), tl.sum(acc, 1))

@triton.jit
def k_welford(x, y, R: tl.constexpr):
    r = tl.arange(0, R)[None, :]
    mean = tl.zeros([1, R], tl.float32)
    m2 = tl.zeros([1, R], tl.float32)
    w = tl.zeros([1, R], tl.float32)
    for off in tl.range(0, 4096, R):
        v = tl.load(x + off + r)
        mean_n, m2_n, w_n = triton_helpers.welford_reduce(v, mean, m2, w, off == 0)
        mean, m2, w = mean_n, m2_n, w_n
    a, b, c = triton_helpers.welford(mean, m2, w, 1)
    tl.store(y + tl.arange(0, 1), a + b + c)

ns, ps = count(k_sum); nw, pw = count(k_welford)
print("sum", ns, "welford", nw)
open("/tmp/s17/welford.ptx", "w").write(pw); open("/tmp/s17/sum.ptx", "w").write(ps)
