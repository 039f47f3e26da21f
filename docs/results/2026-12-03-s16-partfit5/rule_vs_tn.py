"""The library-GEMM grid (target/library_grid.py) and the kernel model against every `tn` row (the models' transposed
weight) of the lead's layouts run (analysis, not a tool): cuBLAS's main-kernel CTAs and waves beside the grid's and
the row-major rule's (MEASURED_TN_GRIDS emptied), and the measured kernel time beside the model's prediction less
its launch floor; counts within 15 %. Usage: python rule_vs_tn.py [TABLE] (the committed CALIBRATED constants)."""
import math, sys
from torch_tessera.lowering.op_class import OpClass
from torch_tessera.target.costmodel import LaunchFeatures
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import CALIBRATED as m, library_waves
from torch_tessera.target import library_grid as lg

table = sys.argv[1] if len(sys.argv) > 1 else "docs/results/2026-12-03-s16/call4/layouts/cublas_layouts.txt"
print(f"model: wave_cycles {m.wave_cycles:g}, operand_bytes_per_clock_per_sm {m.operand_bytes_per_clock_per_sm:g}, "
      f"floor {m.floor_s * 1e6:.2f} us")
print(f"{'M':>5} {'K':>6} {'N':>5} bias {'SMs':>4} | CTAs cuBLAS/grid/row-major rule | waves cuBLAS/grid | kernel us meas / model  err")
n = ok = cta_ok = rm_ok = wave_ok = 0
saved = dict(lg.MEASURED_TN_GRIDS)
done = set()
for line in open(table):
    f = line.split()
    if len(f) < 13 or not f[0].isdigit() or f[4] != "tn":
        continue
    M, K, N = map(int, f[:3]); bias = f[3] == "yes"; sms = int(f[6]); kern = float(f[9]); ctas = int(f[10])
    waves = int(f[11])
    if (M, K, N, bias, sms) in done:  # the run's txt repeats a few rows
        continue
    done.add((M, K, N, bias, sms))
    tiles = math.ceil(M / 128) * math.ceil(N / 128)
    flops = 2.0 * M * N * K + (M * N if bias else 0)
    nbytes = 2.0 * (M * K + K * N + M * N + (N if bias else 0))
    feat = LaunchFeatures(0, OpClass.GEMM, flops, nbytes, True, "aten::addmm" if bias else "aten::mm",
                          2.0 * K * N, tiles, 256, "bf16", depth=K, rows=M, cols=N)
    dev = parse_device("sim:h200" if sms == 132 else f"sim:h200@{sms}sm")
    g = lg.library_grid(feat, 132)
    lg.MEASURED_TN_GRIDS.clear(); rm = lg.library_grid(feat, 132); lg.MEASURED_TN_GRIDS.update(saved)
    pred = (m.predict(feat, dev) - m.floor_s) * 1e6
    err = pred / kern - 1
    lw = library_waves(feat, dev)
    n += 1; ok += abs(err) <= 0.15; wave_ok += lw == waves
    cta_ok += g is not None and abs(g.ctas / ctas - 1) <= 0.15
    rm_ok += rm is not None and abs(rm.ctas / ctas - 1) <= 0.15
    print(f"{M:5} {K:6} {N:5} {'yes' if bias else 'no':>4} {sms:4} | {ctas:4} / {g.ctas if g else '-':>4} / "
          f"{rm.ctas if rm else '-':>4}            | {waves:3} / {lw:3}      | {kern:6.1f} / {pred:6.1f}  {err * 100:+5.0f} %")
print(f"tn rows: {n}; CTAs within 15 %: grid {cta_ok}, row-major rule {rm_ok}; waves equal {wave_ok}; "
      f"kernel time within 15 %: {ok}")
