"""Variants of the kernel model's library-GEMM grid (analysis, not a tool): sets module flags of the experimental
kernelmodel.py kept here as kernelmodel_experiments.py.txt (UNSPLIT_GRID, GRID_IN_OCC, MEM_OCC, WAVES_UNSPLIT,
UNSPLIT_MIN_K; not in the committed model), then runs heldout.py. Usage, with that file copied over
torch_tessera/target/kernelmodel.py: python variants.py TAG NAME=VALUE ... (e.g. gridF UNSPLIT_MIN_K=512)."""
import runpy, sys
from torch_tessera.target import kernelmodel as km
tag = sys.argv[1]
for kv in sys.argv[2:]:
    k, v = kv.split("="); setattr(km, k, eval(v))
sys.argv = ['x', tag]
runpy.run_path('docs/results/2026-12-02-s15-partfit3/heldout.py', run_name='__main__')
