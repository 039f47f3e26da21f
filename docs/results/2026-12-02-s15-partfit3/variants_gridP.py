"""Variant gridP / gridPpart (analysis, not a tool): a small library GEMM that cuBLAS does not split runs as cuBLAS's grid
of min(all SMs, 4 x tiles) pieces (2 x for a skinny GEMM), each at a tensor efficiency of its operand intensity
(sqrt(piece area) / 2 over a 128 x 128 tile's 64); gridPpart only on partitions (the whole GPU keeps one CTA per
tile). Wraps the committed KernelModel.predict, then runs heldout.py. Usage: python variants_gridP.py TAG P|Ppart."""
import dataclasses, math, runpy, sys
from torch_tessera.target import kernelmodel as km
from torch_tessera.lowering.op_class import OpClass
BASE = km.KernelModel.predict
MODE = sys.argv[2] if len(sys.argv) > 2 else "P"
def predict(self, f, device):
    total = device.total_sms
    if (f.kernel_class == OpClass.GEMM and f.tensor_core and f.depth > 0 and 0 < f.blocks < total
            and not km.library_splits(f, total) and f.flops > 0):
        per = 2 if km._skinny(f) else 4
        P = min(total, per * f.blocks)
        rows = min(128.0, f.flops / (2 * f.depth * f.blocks * 128))
        area = rows * 128 * f.blocks / P
        e = min(1.0, math.sqrt(area) / 2 / 64)
        if MODE == "Ppart" and device.sm_count >= total:
            return BASE(self, f, device)
        f2 = dataclasses.replace(f, blocks=P, flops=f.flops / e, depth=1)
        return BASE(self, f2, device)
    return BASE(self, f, device)
km.KernelModel.predict = predict
tag = sys.argv[1]
sys.argv = ['x', tag]
runpy.run_path('docs/results/2026-12-02-s15-partfit3/heldout.py', run_name='__main__')
