"""Variants over the committed model (exploration only)."""
import math, sys
sys.path.insert(0, '/tmp/kf3')
from torch_tessera.target import kernelmodel as km
from torch_tessera.target import catalog
V = sys.argv[1]; opts = set(V.split('+'))

def predict(self, f, device):
    e = catalog.CATALOG.get(device.catalog_key or "")
    clock = e.kernel.boost_clock_hz.value
    blocks, slots, occupied, wave_eff = km._grid(f, device.sm_count, int(e.kernel.max_threads_per_sm.value))
    t_tensor = self._tensor_seconds(f, e, device, clock, math.ceil(blocks / slots), occupied, wave_eff)
    t_cuda = f.flops / (e.peak_fp32_flops.value * device.sm_count / device.total_sms * self.eta_cuda * wave_eff) \
        if f.flops and not f.tensor_core else 0.0
    t_memory = self._memory_seconds(f, e, device, clock, occupied)
    t_waves = 0.0 if 'nowaves' in opts else km.library_waves(f, device) * self.wave_cycles / clock
    if 'latmax' in opts:
        return self.floor_s + max(self.latency_cycles / clock, t_tensor, t_cuda, t_memory, t_waves)
    if 'latsum2' in opts:  # latency and the rest joined by a 2-norm
        return self.floor_s + math.hypot(self.latency_cycles / clock, max(t_tensor, t_cuda, t_memory, t_waves))
    return self.floor_s + self.latency_cycles / clock + max(t_tensor, t_cuda, t_memory, t_waves)
km.KernelModel.predict = predict
import h
h.heldout(V, detail=True)
