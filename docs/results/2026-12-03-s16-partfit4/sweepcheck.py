"""The library-grid rule against session 15's sweep (analysis, not a tool): CTAs within 15 % of cuBLAS's main
kernel, per-CTA operand elements within 15 %, split decision; -v lists the misses. Usage, from the repository root:
python sweepcheck.py [-v]."""
import json, math, re, sys
from types import SimpleNamespace
import torch_tessera.target.library_grid as lg
d=json.load(open('docs/results/2026-12-02-s15/call3/cublas_grids.json'))
ok=okb=n=sd=0
for r in d['rows']:
    k=r['kernels'][0]; M,K,N=r['M'],r['K'],r['N']
    g=math.prod(k['grid']); m=re.search(r'tst_(\d+)x(\d+)_',k['name']); tn,tm=int(m.group(1)),int(m.group(2))
    sk='splitK' in k['name']; s= round(g/(math.ceil(N/tn)*math.ceil(M/tm))) if sk else 1
    f=SimpleNamespace(tensor_core=True, blocks=r['tiles'], rows=M, cols=N, depth=K)
    b=lg.library_grid(f,132)
    if b is None: continue
    n+=1
    bm=(min(tn,N)+min(tm,M))*math.ceil(K/s); br=b.operand_elements
    good=abs(b.ctas-g)<=0.15*g; okb+=abs(br/bm-1)<=0.15; ok+=good; sd+= (b.splits>1)==sk
    if '-v' in sys.argv and (not good or abs(br / bm - 1) > 0.15):
        print(M, K, N, 'meas', g, m.group(0), 's', s, 'rule', b, 'bytes ratio %.2f' % (br / bm))
print('ctas within 15%',ok,'of',n,'; bytes/CTA within 15%',okb,'; split agrees',sd)
