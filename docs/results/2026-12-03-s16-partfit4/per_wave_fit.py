"""Per-wave time of cuBLAS's grid on 16 SMs against a CTA's work (analysis, not a tool): from the lead's table
(docs/results/2026-12-03-s16/cublas_partitions.txt), each shape's us per wave on 16 SMs against the CTA's A and B
bytes ((tile N + tile M) x K / splits x 2) and its FLOPs, each fitted as a + b x feature by least squares; prints
the constants (cycles at the H200's 1.98 GHz boost clock, bytes per clock) and the residuals. Usage, from the
repository root: python per_wave_fit.py."""
import math
import re

import numpy as np

CLOCK = 1.98e9
X, Y = [], []
for line in open("docs/results/2026-12-03-s16/cublas_partitions.txt"):
    f = line.split()
    if len(f) < 11 or not f[0].isdigit() or int(f[5]) != 16:
        continue
    M, K, N, ctas, per_wave = int(f[0]), int(f[1]), int(f[2]), int(f[8]), float(f[10])
    tn, tm = map(int, re.search(r"tst_(\d+)x(\d+)_", line).groups())
    pieces = math.ceil(N / tn) * math.ceil(M / tm)
    splits = ctas // pieces if "splitK" in line else 1
    k = K / splits
    X.append(((tn + tm) * k * 2, 2 * tn * tm * k))
    Y.append(per_wave)
X, Y = np.array(X), np.array(Y)
for col, name in ((0, "operand bytes"), (1, "FLOPs")):
    A = np.c_[np.ones(len(Y)), X[:, col]]
    c, *_ = np.linalg.lstsq(A, Y, rcond=None)
    res = A @ c / Y - 1
    extra = f", {1 / (c[1] * 1e-6) / CLOCK:.1f} B/clk" if col == 0 else ""
    print(f"{name}: {c[0]:.2f} us ({c[0] * 1e-6 * CLOCK:.0f} cycles) + feature x {c[1]:.3g} us{extra}; "
          f"residuals {res.min() * 100:+.0f}..{res.max() * 100:+.0f} %")
