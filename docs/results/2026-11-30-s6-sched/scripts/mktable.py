import re, sys
rows = {}
order = []
for f in sys.argv[1:]:
    cur = None
    for line in open(f):
        m = re.match(r"== (r\d) (\S+) (base|new) (\S+) (\S+)", line)
        if m:
            cur = (m.group(4), m.group(5), m.group(3)); continue
        m = re.search(r"trim on : ([\d.]+) ms .*value ([\d.e-]+) s, gap ([\d.]+) %, (\S+), load ([\d.]+)", line)
        if m and cur:
            key = cur[:2]
            if key not in rows: rows[key] = {"base": [], "new": []}; order.append(key)
            rows[key][cur[2]].append((float(m.group(1)), m.group(2), m.group(4), m.group(3)))
name = {"llama": "Llama-3.1-8B (1412)", "moe": "Mixtral-8x7B (1860)", "mamba": "Mamba-2.8B, 16-token prefill (1414)"}
print("| workload (launches) | devices | before: " + " / ".join(f"round {i+1}" for i in range(len(sys.argv)-1)) + " | after: " + " / ".join(f"round {i+1}" for i in range(len(sys.argv)-1)) + " | value before | value after | gap after | method after |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for key in order:
    b, n = rows[key]["base"], rows[key]["new"]
    fmt = lambda xs: " / ".join(f"{x[0]:.0f} ms" if x[0] < 1000 else f"{x[0]/1e3:.2f} s" for x in xs)
    print(f"| {name[key[0]]} | {key[1].count(',') + 1} | {fmt(b)} | **{fmt(n)}** | {b[0][1]} | {n[0][1]} | {n[0][3]} % | {n[0][2]} |")
