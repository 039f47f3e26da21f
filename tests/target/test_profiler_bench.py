"""Smoke test of the layer profile on CPU (``torch_tessera.measure.layer_profile``, timed on GPUs by
``bench/gpu_layer_profile.py``): the ops it times, its cost-model report and its markdown.

The GPU parts (green contexts, CUDA events) run only on the GPU machine; here the layer is shrunk and the timings are
synthesised from a known roofline, so the calibrate-then-predict pipeline must reproduce them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torch_tessera.target.costmodel import DEFAULT_EFFICIENCY, Efficiency, KernelClass, LaunchFeatures, RooflineModel
from torch_tessera.target.devices import parse_device


@pytest.fixture
def bench(monkeypatch):
    from torch_tessera.measure import layer_profile as mod

    for name, value in dict(HIDDEN=64, HEADS=4, KV_HEADS=2, HEAD_DIM=16, FFN=96, VOCAB=128).items():
        monkeypatch.setattr(mod, name, value)
    monkeypatch.setattr(mod, "SHAPES", {"decode b64 ctx1024": dict(batch=4, q_len=1, ctx=32),
                                        "prefill 4x1024": dict(batch=2, q_len=32, ctx=32)})
    return mod


def test_ops_run_and_count_flops(bench):
    ops = bench.build_ops(dict(batch=4, q_len=1, ctx=32), torch.device("cpu"))
    assert {o.kclass for o in ops} == set(bench.CLASSES)
    for op in ops:
        op.fn(0)
        op.fn(1)
    by = {o.name: o for o in ops}
    assert by["gate_up_proj"].flops == 2 * 4 * (2 * 96) * 64
    assert by["sdpa_gqa"].flops == 2 * 4 * 4 * 1 * 32 * 2 * 16  # no causal halving when decoding
    prefill = {o.name: o for o in bench.build_ops(dict(batch=2, q_len=32, ctx=32), torch.device("cpu"))}
    assert prefill["sdpa_gqa"].flops == 2 * 2 * 4 * 32 * 32 * 2 * 16 / 2


def _results(bench, truth, scale=1e5):
    """Results as the bench records them, timed by ``truth`` on ops ``scale`` times the shrunk layer's size."""
    configs = {}
    for label, dev in (("whole", "cuda:0"), ("24sm", "cuda:1@24sm"), ("96sm+throttle36", "cuda:1@96sm+throttle36")):
        spec = parse_device(dev, assume_gpu="h200")
        shapes = {}
        for shape_name, shape in bench.SHAPES.items():
            rows = []
            for i, op in enumerate(bench.build_ops(shape, torch.device("cpu"))):
                flops, nbytes = op.flops * scale, op.nbytes * scale
                f = LaunchFeatures(i, KernelClass(op.kclass), flops, nbytes, op.tensor_core, op.name)
                rows.append({"op": op.name, "class": op.kclass, "count": op.count, "seconds": truth.predict(f, spec),
                             "flops": flops, "bytes": nbytes, "tensor_core": op.tensor_core})
            shapes[shape_name] = rows
        spec_dict = {k: (v.value if hasattr(v, "value") else v) for k, v in dataclasses.asdict(spec).items()}
        configs[label] = {"device": dev, "spec": spec_dict, "shapes": shapes,
                          "peaks": {"gemm_tflops": 800.0, "copy_gbps": 4000.0}}
    return {"meta": {"date": "today", "torch": "x"}, "configs": configs, "errors": {},
            "links": [{"src": "cuda:0", "dst": "cuda:1", "method": "peer", "bytes": 4096, "seconds": 1e-5,
                       "GB/s": 0.4}]}


def test_model_report_and_markdown(bench):
    eff = dict(DEFAULT_EFFICIENCY)
    eff[KernelClass.GEMM] = Efficiency(0.55, 0.9)
    eff[KernelClass.NORM] = Efficiency(0.1, 0.35)
    truth = RooflineModel(eff, overhead_s=6e-6)
    results = _results(bench, truth)
    whole = bench.class_totals(results["configs"]["whole"]["shapes"]["prefill 4x1024"])
    small = bench.class_totals(results["configs"]["24sm"]["shapes"]["prefill 4x1024"])
    assert small["gemm"] / whole["gemm"] > 2  # the synthetic layer is large enough not to be all overhead
    report = bench.model_error(results)
    assert report["configs"]["whole"]["calibrated_on_it"]
    assert report["model"]["overhead_us"] == pytest.approx(6.0)
    assert set(report["configs"]["24sm"]["by_class_median_pct"]) == set(bench.CLASSES)
    # timings synthesised by a roofline: the calibrated one predicts the partitions within the grid's resolution
    for label in ("24sm", "96sm+throttle36"):
        assert report["configs"][label]["median_abs_error_pct"] < 15
    results["model"] = report
    md = bench.markdown(results)
    assert "## decode b64 ctx1024: per-class time" in md and "| 24sm | 24 |" in md
    assert "| 96sm+throttle36 | 96+36thr |" in md and "## Links GPU0 <-> GPU1" in md
    assert "median abs error" in md
    totals = bench.class_totals(results["configs"]["whole"]["shapes"]["prefill 4x1024"])
    rows = results["configs"]["whole"]["shapes"]["prefill 4x1024"]
    assert totals["norm"] == pytest.approx(2 * next(r["seconds"] for r in rows if r["op"] == "rms_norm"))
