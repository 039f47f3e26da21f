"""Session 18 (analysis, not a tool): one model held out at a time, features from the working tree, data from DIR =
/tmp/cal18 (session 11's launch times, each tarball in its own subfolder, plus call 2's attention_mask.json).
VARIANT letters keep a feature on: r = ragged, c = load_chain (the stores variant of the table in NOTES.md was an
earlier state of the code, removed since).

    python heldout.py TAG VARIANT STARTS MODEL[,MODEL]      e.g. python heldout.py final rc 8 dit
"""
import sys, time, dataclasses, numpy as np
from torch_tessera.commands import calibrate as cal
from torch_tessera.target.devices import parse_device
tag, variant, starts, helds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
t0 = time.time()
samples, _ = cal.load_launch_time_samples('/tmp/cal18', 5e-6)
sw, _ = cal.load_attention_sweep('/tmp/cal18')
samples += sw
samples = [dataclasses.replace(s, features=dataclasses.replace(
    s.features, ragged=s.features.ragged if "r" in variant else False,
    load_chain=s.features.load_chain if "c" in variant else False)) for s in samples]
print("ragged samples", sum(s.features.ragged for s in samples), "chain", sum(s.features.load_chain for s in samples))
specs = {d: parse_device(d) for d in {s.device for s in samples}}
print(f"{tag}: {len(samples)} samples, {time.time()-t0:.0f}s", flush=True)
for held in helds:
    train = [s for s in samples if s.model != held]
    m = cal.fit(train, specs, starts=starts)
    res = [(s, m.predict(s.features, specs[s.device]) / s.seconds - 1) for s in samples if s.model == held]
    w = np.median([abs(e) for s, e in res if "@" not in s.device]); p = np.median([abs(e) for s, e in res if "@" in s.device])
    print(f"{tag} held {held}: whole {w*100:.2f} parts {p*100:.2f} train loss {cal._loss(m, train, specs):.4f} "
          f"({time.time()-t0:.0f}s) " + str({k: round(getattr(m, k), 4) for k in cal.FREE}), flush=True)
