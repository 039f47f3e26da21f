"""The library-GEMM grid rule (target/library_grid.py) and the kernel model against every row of the lead's cuBLAS
measurement on the H200's partitions (analysis, not a tool): per row, cuBLAS's main-kernel CTAs and waves beside the
rule's, and the measured kernel time (profiler, all kernels of the launch) beside the model's prediction less its
launch floor; the count of rows within 15 %. Usage: python rule_vs_partitions.py [TABLE] [--wave CYCLES --rate B]
(default: the committed CALIBRATED constants)."""
import argparse, dataclasses, math, re
from torch_tessera.lowering.op_class import OpClass
from torch_tessera.target.costmodel import LaunchFeatures
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import CALIBRATED, library_waves
from torch_tessera.target.library_grid import library_grid

p = argparse.ArgumentParser()
p.add_argument("table", nargs="?", default="docs/results/2026-12-03-s16/cublas_partitions.txt")
p.add_argument("--wave", type=float)
p.add_argument("--rate", type=float)
a = p.parse_args()
m = CALIBRATED
if a.wave is not None:
    m = dataclasses.replace(m, wave_cycles=a.wave)
if a.rate is not None:
    m = dataclasses.replace(m, operand_bytes_per_clock_per_sm=a.rate)
print(f"model: wave_cycles {m.wave_cycles:g}, operand_bytes_per_clock_per_sm {m.operand_bytes_per_clock_per_sm:g}, "
      f"floor {m.floor_s * 1e6:.2f} us")
print(f"{'M':>5} {'K':>6} {'N':>5} bias {'SMs':>4} | CTAs cuBLAS/rule | waves cuBLAS/rule | tile cuBLAS / rule (split)"
      f" | kernel us meas / model  err")
n = ok = grid_ok = 0
for line in open(a.table):
    f = line.split()
    if len(f) < 11 or not f[0].isdigit():
        continue
    M, K, N = map(int, f[:3]); bias = f[3] == "yes"; sms = int(f[5]); kern = float(f[7]); ctas = int(f[8])
    waves = int(f[9])
    tile = re.search(r"tst_(\d+x\d+)_", line).group(1) + ("/sK" if "splitK" in line else "")
    tiles = math.ceil(M / 128) * math.ceil(N / 128)
    flops = 2.0 * M * N * K + (M * N if bias else 0)
    nbytes = 2.0 * (M * K + K * N + M * N + (N if bias else 0))
    feat = LaunchFeatures(0, OpClass.GEMM, flops, nbytes, True, "aten::addmm" if bias else "aten::mm",
                          2.0 * K * N, tiles, 256, "bf16", depth=K, rows=M, cols=N)
    dev = parse_device("sim:h200" if sms == 132 else f"sim:h200@{sms}sm")
    g = library_grid(feat, 132)
    pred = (m.predict(feat, dev) - m.floor_s) * 1e6
    err = pred / kern - 1
    n += 1; ok += abs(err) <= 0.15; grid_ok += library_waves(feat, dev) == waves
    print(f"{M:5} {K:6} {N:5} {'yes' if bias else 'no':>4} {sms:4} | {ctas:4} / {g.ctas:4}      | {waves:3} / "
          f"{library_waves(feat, dev):3}         | {tile:10} / {g.tile_n}x{g.tile_m} ({g.splits}) | "
          f"{kern:6.1f} / {pred:6.1f}  {err * 100:+5.0f} %")
print(f"{ok} of {n} rows within 15 % (kernel time); waves equal to cuBLAS's in {grid_ok} of {n}")
