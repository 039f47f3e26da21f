# Session 13 graphoverlap probe (NOTES.md beside it): per launch, event pair (min of 3 / 7), one event between
# launches (median of 7), no events, and one CUDA graph; whole H200 and 104- / 24-SM partitions. Run inline on the device.
import torch,json,statistics as S,os
from torch_tessera.compat.torch_cuda import spin
E=lambda:torch.cuda.Event(enable_timing=True)
def sets(d):
 t=torch.randn(4096,device=d);m=torch.randn(4<<20,device=d)
 a=torch.randn(1024,1024,device=d,dtype=torch.bfloat16);b=a.clone();c=a.clone()
 T=lambda:t.mul_(1.0001);M=lambda:m.mul_(1.0001);G=lambda:torch.mm(a,b,out=c)
 return {"tiny":[T]*200,"medium":[M]*200,"gemm":[G]*200,"mix":[T,T,M,G,T]*40}
def pair(ops,s,r):
 best=[9.]*len(ops)
 for _ in range(r):
  mk=[]
  with torch.cuda.stream(s):
   spin(4e-4*len(ops))
   for op in ops:
    a,b=E(),E();a.record(s);op();b.record(s);mk.append((a,b))
  s.synchronize();best=[min(x,a.elapsed_time(b)/1e3) for x,(a,b) in zip(best,mk)]
 return best
def marker(ops,s,r):
 runs=[]
 for _ in range(r):
  with torch.cuda.stream(s):
   spin(4e-4*len(ops));ms=[E()];ms[0].record(s)
   for op in ops:
    op();e=E();e.record(s);ms.append(e)
  s.synchronize();runs.append([a.elapsed_time(b)/1e3 for a,b in zip(ms,ms[1:])])
 return [S.median(c) for c in zip(*runs)]
def tot(run,s,r):
 o=[]
 for _ in range(r):
  with torch.cuda.stream(s):
   spin(0.08);a,b=E(),E();a.record(s);run();b.record(s)
  s.synchronize();o.append(a.elapsed_time(b)/1e3)
 return S.median(o)
def probe(s,d,r=7):
 res={}
 for k,ops in sets(d).items():
  with torch.cuda.stream(s):
   [op() for op in ops]
  s.synchronize();g=torch.cuda.CUDAGraph()
  with torch.cuda.graph(g,stream=s):
   [op() for op in ops]
  s.synchronize();p=pair(ops,s,3);q=pair(ops,s,r);m=marker(ops,s,r)
  st=tot(lambda:[op() for op in ops],s,r);gr=tot(g.replay,s,r);n=len(ops)
  res[k]=dict(n=n,pair3=sum(p),pair7=sum(q),marker=sum(m),stream=st,graph=gr,d_pair3=(sum(p)-gr)/(n-1)*1e6,d_pair7=(sum(q)-gr)/(n-1)*1e6,d_marker=(sum(m)-gr)/(n-1)*1e6,d_stream=(st-gr)/(n-1)*1e6,pair_med_us=S.median(p)*1e6,marker_med_us=S.median(m)*1e6)
  print(k,{a:round(v,3) for a,v in res[k].items()},flush=True)
 return res
d=torch.device("cuda:0");out={"torch":torch.__version__}
print("whole");out["whole"]=probe(torch.cuda.Stream(d),d)
for n in (104,24):
 try:
  from torch_tessera.target.green import create_partition
  p,_=create_partition(0,n);print(n,p.granted_sms);out[f"{n}sm"]=probe(p.stream,d)
 except Exception as e:
  print(n,"failed",e);out[f"{n}sm"]=str(e)
json.dump(out,open(os.environ["OUT"]+"/overlap_probe.json","w"),indent=1)
