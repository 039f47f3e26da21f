import sys
def rows(f):
    out = {}
    for line in open(f):
        p = line.split()
        if len(p) > 8 and p[0] == "layers":
            k, D = int(p[1]), int(p[2])
            ms = float(p[3])
            # columns: kind kernels devices solve_ms [paper_ms] cycle bound gap vs method ref
            rest = p[4:]
            if not rest[4][0].isalpha():
                rest = rest[1:]
            cyc, bnd, gap, vs, meth = float(rest[0]), float(rest[1]), float(rest[2]), float(rest[3]), rest[4]
            out[(k, D)] = (ms, cyc, gap, vs, meth)
    return out
before, after = rows(sys.argv[1]), rows(sys.argv[2])
f = lambda ms: f"{ms:.0f} ms" if ms < 1000 else f"{ms/1e3:.1f} s"
print("| kernels | 2 devices: before -> after | 3 devices | 4 devices | after vs best (2 / 3 / 4 devices) | value after vs before (2 / 3 / 4) |")
print("| --- | --- | --- | --- | --- | --- |")
for k in sorted({k for k, _ in after}):
    cells, vs, dv = [], [], []
    for D in (2, 3, 4):
        a = after.get((k, D)); b = before.get((k, D))
        cells.append(f"{f(b[0]) if b else '?'} -> **{f(a[0])}**")
        vs.append(f"{a[3]:.2g}" if k <= 500 else "-")
        dv.append(f"{100*(a[1]/b[1]-1):+.2f} %" if b else "?")
    print(f"| {k} | " + " | ".join(cells) + f" | {' / '.join(vs)} % | {' / '.join(dv)} |")
