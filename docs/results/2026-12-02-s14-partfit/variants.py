"""Variants of KernelModel.predict (analysis, not a tool): each replaces the model's predict, then heldout.py's
held-out fits run on it. Usage, from this directory: python variants.py NAME [NAME...]. The variants were run over
main's kernel model (38e43e8: ``_grid(f, sms, threads)``, ``_split_k(f, sms)``), i.e. with PYTHONPATH at a checkout
of main; ``splitN`` hard-codes the H200's 132 SMs (every sample is an H200's) and runs on main's model only. This
branch commits ``split4``; ``draw2`` and ``knee2`` were also run over it (NOTES.md: split4 + draw2 / knee2)."""
import inspect
import math
import sys
from dataclasses import field, make_dataclass

from torch_tessera.commands import calibrate as cal
from torch_tessera.target import catalog
from torch_tessera.target import kernelmodel as km

BASE_PREDICT = km.KernelModel.predict
DEFAULTS = {"dram_bpc_cuda": 32.0}
STARTS = {"wv1": {"wave_cycles": 4000.0}, "wv1d": {"wave_cycles": 4000.0}}


def parts(self, f, device):
    e = catalog.CATALOG.get(device.catalog_key)
    clock = e.kernel.boost_clock_hz.value
    extra = (device.total_sms,) if "total_sms" in inspect.signature(km._grid).parameters else ()  # this branch's
    blocks, slots, occupied, wave_eff = km._grid(f, device.sm_count, int(e.kernel.max_threads_per_sm.value), *extra)
    waves = math.ceil(blocks / slots)
    t_tensor = self._tensor_seconds(f, e, device, clock, waves, occupied, wave_eff)
    t_cuda = f.flops / (e.peak_fp32_flops.value * device.sm_count / device.total_sms * self.eta_cuda * wave_eff) \
        if f.flops and not f.tensor_core else 0.0
    t_memory = self._memory_seconds(f, e, device, clock, occupied)
    t_waves = km.library_waves(f, device) * self.wave_cycles / clock
    return clock, blocks, slots, occupied, wave_eff, waves, t_tensor, t_cuda, t_memory, t_waves


def v_tw(self, f, device):
    """every wave of a CUDA-core grid lasts at least the latency"""
    clock, blocks, slots, occ, we, waves, tt, tc, tm, tw = parts(self, f, device)
    lat = self.latency_cycles / clock * (waves if (f.blocks and not f.tensor_core) else 1)
    return self.floor_s + max(lat, tt, tc, tm, tw)


def v_tw2(self, f, device):
    """each wave after the first of a CUDA-core grid adds cta_cycles to the latency"""
    clock, blocks, slots, occ, we, waves, tt, tc, tm, tw = parts(self, f, device)
    extra = (waves - 1) * self.cta_cycles / clock if (f.blocks and not f.tensor_core) else 0.0
    return self.floor_s + max(self.latency_cycles / clock + extra, tt, tc, tm, tw)


VARIANTS = {"tw": (v_tw, {}), "tw2": (v_tw2, {"cta_cycles": (10.0, 40000.0)})}

def main():
    for name in sys.argv[1:]:
        fn, extra = VARIANTS[name]
        extra_fields = [(k, float, field(default=DEFAULTS.get(k, 1000.0))) for k in extra]
        cls = make_dataclass("KM_" + name, extra_fields, bases=(km.KernelModel,), frozen=True)
        cls.predict = fn
        km.KernelModel = cls
        cal.FREE = {**cal.FREE, **extra}
        import heldout
        heldout.heldout(name, detail=True, start=cls(**STARTS.get(name, {})))
        km.KernelModel = cls.__mro__[1]


def mem_l2max(self, f, e, device, clock, occupied):
    """DRAM bytes at the DRAM draw, and every byte through the SMs' load path at the L2 rate: the longer of the two"""
    l2 = e.kernel.l2_bytes.value * km.L2_REUSE
    if f.reuse is None:
        activations = max(0.0, f.nbytes - f.param_bytes)
        in_l2 = activations if activations <= l2 else 0.0
    else:
        in_l2 = min(f.nbytes, km.l2_bytes_read(f.reuse, l2))
    bandwidth = min(self.dram_bandwidth(e.mem_bandwidth.value, occupied, clock), device.mem_bandwidth)
    return max((f.nbytes - in_l2) / bandwidth, f.nbytes / (self.l2_bytes_per_clock_per_sm * occupied * clock))


def v_l2max(self, f, device):
    orig = km.KernelModel._memory_seconds
    km.KernelModel._memory_seconds = mem_l2max
    try:
        return BASE_PREDICT(self, f, device)
    finally:
        km.KernelModel._memory_seconds = orig


def v_knee2(self, f, device):
    km.KNEE = 2.0
    return BASE_PREDICT(self, f, device)


VARIANTS.update({"l2max": (v_l2max, {}), "knee2": (v_knee2, {})})



def v_draw2(self, f, device):
    """CUDA-core (Triton) launches keep fewer DRAM bytes in flight per SM than tensor-core (library) ones"""
    if f.tensor_core:
        return BASE_PREDICT(self, f, device)
    return BASE_PREDICT(km.dataclasses_replace(self, dram_bytes_per_clock_per_sm=self.dram_bpc_cuda), f, device)


import dataclasses
km.dataclasses_replace = dataclasses.replace
VARIANTS.update({"draw2": (v_draw2, {"dram_bpc_cuda": (2.0, 256.0)})})



def v_wv1(self, f, device):
    """a small library GEMM's first wave is the launch's latency; each further wave adds wave_cycles"""
    clock, blocks, slots, occ, we, waves, tt, tc, tm, tw = parts(self, f, device)
    lw = km.library_waves(f, device)
    lat = self.latency_cycles / clock + max(0, lw - 1) * self.wave_cycles / clock
    return self.floor_s + max(lat, tt, tc, tm)


def v_wv1d(self, f, device):
    """wv1 with draw2"""
    if f.tensor_core:
        return v_wv1(self, f, device)
    return v_wv1(km.dataclasses_replace(self, dram_bytes_per_clock_per_sm=self.dram_bpc_cuda), f, device)


VARIANTS.update({"wv1": (v_wv1, {}), "wv1d": (v_wv1d, {"dram_bpc_cuda": (2.0, 256.0)})})



ORIG_SPLIT, ORIG_LW = km._split_k, km.library_waves


def make_split(div):
    """the library splits K only for fewer than all SMs // div output tiles"""
    def split_k(f, sms):
        if f.kernel_class != km.OpClass.GEMM or not f.tensor_core or f.blocks >= sms:
            return f.blocks
        if f.depth > 0 and f.blocks * div > 132:  # TODO total sms
            return f.blocks
        return ORIG_SPLIT(f, sms)

    def lw(f, device):
        if f.kernel_class == km.OpClass.GEMM and f.tensor_core and f.depth > 0 and f.blocks * div > device.total_sms:
            return 0
        return ORIG_LW(f, device)

    def predict(self, f, device):
        km._split_k, km.library_waves = split_k, lw
        try:
            return BASE_PREDICT(self, f, device)
        finally:
            km._split_k, km.library_waves = ORIG_SPLIT, ORIG_LW
    return predict


VARIANTS.update({f"split{d}": (make_split(d), {}) for d in (3, 4, 5, 6, 8)})


if __name__ == "__main__":
    main()
