"""Planning workloads built from registry models lowered without weights."""

from __future__ import annotations

import numpy as np

from torch_tessera.backend.workload import model_workload
from torch_tessera.runtime.devices import parse_devices


def test_llm_workload_has_prefill_and_decode_and_recosts_on_other_devices():
    mw = model_workload("llama", parse_devices("sim:a100,sim:l40s"), size="tiny", prefill_tokens=16, decode_batch=4,
                        mean_output_tokens=8)
    names = [p.name for p in mw.workload.programs]
    assert names == ["prefill", "decode"] and len(mw.programs) == 2
    assert mw.workload.programs[1].frequency == 8 / 4  # decode steps per request, shared by the batch
    other = mw.on_devices(parse_devices("sim:h100,sim:l4"))
    assert other.topology.devices == ("sim:h100", "sim:l4")
    for a, b in zip(mw.workload.programs, other.workload.programs):
        assert a.dag is b.dag and a.costs.kernels == b.costs.kernels
        assert b.costs.devices == ("sim:h100", "sim:l4")
        # the L4 (121 TFLOP/s, 300 GB/s) is never faster than the H100 at any kernel
        assert np.all(b.costs.seconds[:, 1] >= b.costs.seconds[:, 0])
