"""tessera's space in every bench (issue 21, item 3): the planner's single placement, one request stream per device
and every baseline's placement; tessera is the best predicted of them, so no baseline is predicted above it."""

from __future__ import annotations

import argparse
import math

import pytest

from torch_tessera.benchmark import SINGLE, STREAMS, choose_tessera, simulate_plans
from torch_tessera.commands.plan import _synthetic_inputs, plan_all
from torch_tessera.scheduler import Plan


@pytest.fixture(scope="module")
def synthetic():
    """A 2-layer synthetic transformer on big + small, every baseline planned: (plans named as the bench names
    them, workload, topology)."""
    args = argparse.Namespace(devices="big,small", synthetic_layers=2, output_tokens=129.0)
    wl, topo, model = _synthetic_inputs(args)
    plans = plan_all(wl, None, topo, "throughput", True, micro_batches=2, time_limit=5.0, cache_dir=False,
                     pipeline=model)
    work = {("tessera" if k == "throughput" else k): v for k, v in plans.items() if k != "latency"}
    return work, wl, topo


def _baselines(plans: dict) -> dict:
    return {n: p for n, p in plans.items() if n not in ("tessera", SINGLE) and isinstance(p, Plan)}


def test_tessera_is_the_best_of_a_space_with_streams_and_every_baseline(synthetic):
    plans, wl, topo = synthetic
    c = choose_tessera(plans, wl, topo, micro_batches=2)
    assert set(c.scores) == {"tessera", STREAMS} | set(_baselines(plans))  # every candidate was scored
    assert c.scores[c.chosen] <= min(c.scores.values()) * (1 + 1e-9)  # within 1e-9 the planner's, then streams
    t = c.plans["tessera"]
    assert t.cycle_seconds == pytest.approx(c.scores[c.chosen])
    assert all(t.throughput_per_s >= p.throughput_per_s * (1 - 1e-9) for p in _baselines(plans).values())
    assert all(c.plans[n] is p for n, p in _baselines(plans).items())  # the baselines' rows are unchanged
    assert "one request stream per device" in c.note and "request-dist's placement" in c.note
    assert (SINGLE in c.plans) == (c.chosen != "tessera")
    if c.chosen != "tessera":
        assert c.plans[SINGLE] is plans["tessera"] and c.note.endswith(f"is {SINGLE}")
    if c.chosen == STREAMS:  # its programs are the streams' own: <name>@<r>
        assert any("@" in n for n in t.placements)


def test_without_streams_the_space_is_single_placements_and_baselines(synthetic):
    plans, wl, topo = synthetic
    c = choose_tessera(plans, wl, topo, streams=False, micro_batches=2)
    assert STREAMS not in c.scores and "one request stream per device: not a candidate" in c.note
    assert not any("@" in n for n in c.plans["tessera"].placements)
    best = max(p.throughput_per_s for p in _baselines(plans).values())
    assert c.plans["tessera"].throughput_per_s >= best * (1 - 1e-9)


def test_takeover_limits_the_baselines_and_ties_go_to_the_planner(synthetic):
    plans, wl, topo = synthetic
    c = choose_tessera(plans, wl, topo, streams=False, takeover=lambda n, p: n.startswith("homo-"))
    assert set(c.scores) == {"tessera", "homo-L", "homo-R"}
    same = {"tessera": plans["homo-L"], "homo-L": plans["homo-L"]}  # a baseline scoring exactly as the planner
    tie = choose_tessera(same, streams=False)
    assert tie.chosen == "tessera" and SINGLE not in tie.plans and tie.plans["tessera"] is plans["homo-L"]
    slower = choose_tessera({"tessera": plans["af"], "homo-L": plans["homo-L"]}, streams=False,
                            score=lambda p: 1.0 if p is plans["af"] else 2.0)
    assert slower.chosen == "tessera" and "homo-L's placement 2,000 ms/step" in slower.note


@pytest.mark.parametrize("model", ["mlp", "llama"])
def test_full_size_prediction_plans_streams_by_default_and_not_with_no_streams(model):
    """The full-size model on the paper's A100 + L40S (llama: the README's main job; its cold lowering takes 1-2
    minutes on a 2-core CPU, cached after): tessera at or above every baseline, the streams candidate scored by
    default and not without it."""
    from torch_tessera.target.devices import parse_devices

    specs = parse_devices("sim:a100,sim:l40s")
    for streams in (True, False):
        rows, meta = simulate_plans(model, specs, size="full", streams=streams)
        by = {r.plan: r for r in rows}
        assert (STREAMS in meta["tessera_space"]) == streams, meta["tessera_choice"]
        assert meta["tessera_from"] in meta["tessera_space"] and meta["tessera_choice"].startswith("tessera = ")
        best = max(r.output_per_s for n, r in by.items() if n not in ("tessera", SINGLE) and r.applies)
        assert by["tessera"].output_per_s >= best * (1 - 1e-9) and not math.isnan(best)
        assert min(meta["tessera_space"].values()) == pytest.approx(by["tessera"].cycle_s, rel=1e-8)


def test_the_check_places_each_plan_on_every_graph_it_applies_to(monkeypatch):
    """A model Dynamo compiles as several graphs (the VLM): af applies only to the graph with attention; the others
    stay on the first device, and every plan still computes what eager computes."""
    import torch

    import torch_tessera.models as models
    from torch_tessera.benchmark import check_plans
    from torch_tessera.target.devices import parse_devices

    class AttentionThenBreak(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 8, 16)
            torch._dynamo.graph_break()
            return self.out(torch.relu(y))

    torch.manual_seed(0)
    monkeypatch.setattr(models, "build_model", lambda name, size: (AttentionThenBreak().eval(),
                                                                    (torch.randn(1, 8, 16),)))
    rows = {r.plan: r for r in check_plans("vlm-like", ["cpu:0", "cpu:1"], parse_devices("sim:a100,sim:l40s"))}
    assert all(r.equal for r in rows.values()), rows
    assert rows["af"].graphs == (1, 2) and rows["homo-R"].graphs == (2, 2) and rows["layer"].graphs == (0, 2)
    assert rows["homo-R"].launches_per_device[0] == 0 and rows["homo-R"].launches_per_device[1] > 0
