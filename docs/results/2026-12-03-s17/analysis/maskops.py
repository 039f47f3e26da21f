import json, math, statistics, sys
d=json.load(open(sys.argv[1]))
TP=float(sys.argv[2]) if len(sys.argv)>2 else 1.16
vals=[]
for r in d['rows']:
    b,h,L,S,E=r['shape']; sms=r['sms']; total=132
    blocks=b*h*math.ceil(L/128)
    if blocks>=sms: we=blocks/(math.ceil(blocks/sms)*sms); occ=sms
    else: occ=blocks; we=occ/sms
    power=max(1.0,TP*occ/total)
    sfu=16*sms*1.98e9*we/power
    mo=(r['seconds_masked']-r['seconds_plain'])*sfu/r['scores']
    vals.append(mo); print(r['shape'], r['device'], f"{mo:.2f}")
print('median', statistics.median(vals), 'mean', statistics.mean(vals))
