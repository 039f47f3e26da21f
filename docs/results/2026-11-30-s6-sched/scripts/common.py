import os, pickle, sys, time
import numpy as np
sys.path.insert(0, "/work/wt-sched")
from torch_tessera.target.devices import parse_devices
from torch_tessera.scheduler.problem import compile_problem
from torch_tessera.scheduler.blocks import aggregate, block_cycle, tie_layers
D2 = "sim:a100,sim:l40s"
D4 = "sim:a100,sim:l40s,sim:h100,sim:rtxpro6000"
PK = {"llama": "/tmp/s6/llama_1024.pkl", "moe": "/tmp/s6/moe_1024.pkl", "mamba": "/tmp/s6/mamba_16.pkl"}

def load(model, devices):
    mw = pickle.load(open(PK[model], "rb"))
    if tuple(mw.topology.devices) != tuple(devices.split(",")) or getattr(mw.topology, "hop_overhead", None) is None:
        mw = mw.on_devices(parse_devices(devices))
    return mw

def problem(model, devices):
    mw = load(model, devices)
    pb = compile_problem(mw.workload, mw.topology, micro_batches=2)
    return mw, pb
