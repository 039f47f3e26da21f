"""Green-context partitions, the streamer and link measurement on a real GPU (skipped without CUDA)."""

from __future__ import annotations

import time

import pytest
import torch

from torch_tessera.target import green
from torch_tessera.target.devices import open_device, parse_device
from torch_tessera.target.links import measure_links

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
green_ok = pytest.mark.skipif(
    not torch.cuda.is_available() or not (green.cuda_python_available() or hasattr(torch.cuda, "GreenContext")),
    reason="needs a CUDA GPU and cuda-python or torch.cuda.GreenContext")


@green_ok
def test_partition_grants_a_hardware_group_and_runs_torch_ops():
    props = torch.cuda.get_device_properties(0)
    want = green.predict_granted_sms(20, props.major, props.multi_processor_count)
    with open_device("cuda:0@20sm") as d:
        assert d.spec.sm_count == want and d.partition.granted_sms == want
        s1, s2 = d.default_stream, d.new_stream(priority=-1)
        with d.guard(), torch.cuda.stream(s1):
            x = torch.ones(1 << 20, device=d.torch_device)
            y = (x * 3).sum()
        s1.synchronize()
        assert y.item() == 3 * (1 << 20)
        with d.guard(), torch.cuda.stream(s2):
            z = x + 1
        s2.synchronize()
        assert z[0].item() == 2


@green_ok
def test_streamer_streams_until_stopped():
    total = torch.cuda.get_device_properties(0).multi_processor_count
    with open_device(f"cuda:0@{total // 2 // 8 * 8}sm+throttle16") as d:
        assert d.streamer is not None and d.streamer.running
        time.sleep(0.2)
        d.streamer.stop()
        assert not d.streamer.running and d.streamer.achieved_bytes_per_s > 1e10


@cuda
def test_whole_gpu_spec_matches_the_hardware():
    d = parse_device("cuda:0")
    props = torch.cuda.get_device_properties(0)
    assert d.sm_count == props.multi_processor_count and d.arch == f"sm_{props.major}{props.minor}"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_link_measurement_between_two_gpus():
    with open_device("cuda:0") as a, open_device("cuda:1") as b:
        (ab, ba) = measure_links([a, b], sizes=(4096, 64 << 20), repeats=3, progress=False)
    assert ab.src == "cuda:0" and ba.src == "cuda:1"
    assert ab.bandwidth > 1e9 and 0 < ab.latency < 1e-3
