import numpy as np, sys, dataclasses, time, math, os
sys.path.insert(0,'/tmp/s17'); import patch_helpers
from torch_tessera.commands import calibrate as cal
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import KernelModel
samples,_=cal.load_launch_time_samples('/tmp/pf4_kt',5e-6)
specs={d: parse_device(d) for d in {s.device for s in samples}}
fixed = {k: float(v) for k, v in (kv.split("=") for kv in os.environ.get("FIXED", "").split(",") if kv)}
for k in fixed: cal.FREE.pop(k, None)
if os.environ.get("FREEMASK"): cal.FREE["mask_ops"]=(0.01,20.0); fixed.setdefault("mask_ops",1.0)
held=sys.argv[1]
train=[s for s in samples if s.model!=held]
if os.environ.get("ATTN"):
    import json as _j
    from torch_tessera.target.costmodel import LaunchFeatures, KernelClass
    from torch_tessera.commands.calibrate import Sample
    extra=[]
    for r in _j.load(open(os.environ["ATTN"]))["rows"]:
        b,h,L,S,E=r["shape"]; sc=float(b*h*L*S)
        dev="sim:h200" if r["sms"]==132 else f"sim:h200@{r['sms']}sm"
        specs.setdefault(dev, parse_device(dev))
        nb=float(2*(2*b*h*L*E+2*b*h*S*E))
        for masked,t in ((False,r["seconds_plain"]),(True,r["seconds_masked"])):
            f=LaunchFeatures(0,KernelClass.ATTENTION,4.0*sc*E,nb+(2*L*S if masked else 0),True,"attn-sweep",0.0,b*h*math.ceil(L/128),256,"bf16",sc,None,masked=masked)
            extra.append(Sample("attn-sweep","sweep",dev,f,t))
    train=train+extra
    print("with", len(extra), "attention sweep samples", flush=True)
def loss(m, ss):
    e=np.array([m.predict(s.features,specs[s.device])/s.seconds-1 for s in ss])
    return float(np.mean(np.log1p((np.log1p(e)/0.1)**2)))
rng=np.random.default_rng(0)
base=dataclasses.replace(KernelModel(),**fixed)
for i in range(int(sys.argv[2])):
    if i==0: st=base
    else:
        st=dataclasses.replace(base,**{n: float(math.exp(rng.uniform(math.log(lo)+0.3*(math.log(hi)-math.log(lo)), math.log(hi)-0.3*(math.log(hi)-math.log(lo))))) for n,(lo,hi) in cal.FREE.items()})
    t0=time.time(); m=cal.fit(train,specs,start=st)
    res=[(s,m.predict(s.features,specs[s.device])/s.seconds-1) for s in samples if s.model==held]
    w=np.median([abs(e) for s,e in res if '@' not in s.device]); p=np.median([abs(e) for s,e in res if '@' in s.device])
    import pickle; pickle.dump([(s.model,s.program,s.device,s.features,s.seconds,e) for s,e in res], open(f"/tmp/s17/msrows_{held}_{i}.pkl","wb"))
    print(i, f"train loss {loss(m,train):.4f}  held {held} {w*100:.2f}/{p*100:.2f}", {k: round(getattr(m,k),3) for k in cal.FREE}, f"{time.time()-t0:.0f}s", flush=True)
