"""The simulator's host-issue model (a schedule replayed step by step from the host) and its weighted DRAM sharing
(partitions of one GPU get shares in proportion to their SMs), each against an independent reference, and the
sharing model against the measured two-copies case."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import fixpoint_step, random_schedules
from torch_tessera.errors import ConfigError
from torch_tessera.scheduler.issue import HostIssue, issue_order, issue_times
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RunStep
from torch_tessera.scheduler.simulate import MemoryShare, simulate, step_durations, water_fill
from torch_tessera.scheduler.synthetic import nvlink_topology

CALIBRATION = Path(__file__).resolve().parents[2] / "docs/results/2026-12-01-s9/pipesched_calibration.json"


def _schedules():
    return random_schedules(4)


def _reference_with_host(s: PipelinedSchedule, dur, host: HostIssue) -> float:
    """Fixpoint over the step graph: start = max(end of the previous step on the stream, the record's end for a
    wait, the host's cumulative issue time in round-robin order); end = start + duration. Iterated to a fixpoint."""
    issued, t = {}, 0.0
    for x in issue_order(s):
        t += host.seconds(x)
        issued[id(x)] = t
    return fixpoint_step(s, dur, issued)


@pytest.mark.parametrize("host", [HostIssue(), HostIssue(run=1e-7, transfer=1e-7, record=1e-8, wait=1e-8)],
                         ids=["measured", "fast-host"])
def test_host_issue_matches_a_fixpoint_reference(host):
    for dag, costs, s in _schedules():
        topo = nvlink_topology(["a", "b"])
        r = simulate(s, costs, topo, wait_seconds=1e-6, host=host)
        dur = step_durations(s, costs, topo, 1e-6)
        assert r.step_seconds == pytest.approx(_reference_with_host(s, dur, host), rel=1e-9)
        issued = issue_times(s, host)
        for d in range(s.devices):  # no step starts before the host has issued it
            assert (r.start[d] >= issued[d] - 1e-15).all()
        free = simulate(s, costs, topo, wait_seconds=1e-6)
        total = sum(host.seconds(x) for x in s.steps())
        assert r.step_seconds >= max(free.step_seconds, total) - 1e-12


def test_host_issue_with_sharing_equals_the_longest_path_when_nothing_contends():
    """The event loop (memory sharing on) and the one-pass longest path give the same host-bound step when the
    domain's bandwidth covers every demand."""
    for dag, costs, s in _schedules():
        nodes = sorted(dag.graph.nodes)
        mem = MemoryShare({n: 1e6 for n in nodes}, (4e12, 1.7e12), {0: 1e15, 1: 1e15}, (104, 24))
        host = HostIssue()
        a = simulate(s, costs, None, host=host)
        b = simulate(s, costs, None, host=host, memory=mem)
        assert b.step_seconds == pytest.approx(a.step_seconds, rel=1e-9)
        assert a.step_seconds > simulate(s, costs, None).step_seconds  # the host bounds these small launches


def _level_fill(demand, capacity, weights):
    """Reference: bisection on the level ``L`` of ``sum(min(demand, L x weights)) = capacity``."""
    if demand.sum() <= capacity:
        return demand
    lo, hi = 0.0, float((demand / weights).max())
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.minimum(demand, mid * weights).sum() < capacity else (lo, mid)
    return np.minimum(demand, hi * weights)


def test_weighted_water_fill_against_bisection():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 5))
        demand, weights = rng.uniform(0.1, 4.0, n), rng.uniform(1, 100, n)
        cap = float(rng.uniform(0.5, 1.2) * demand.sum())
        got = water_fill(demand, cap, weights)
        assert np.allclose(got, _level_fill(demand, cap, weights), rtol=1e-6, atol=1e-9)
        assert (got <= demand + 1e-12).all() and got.sum() == pytest.approx(min(cap, demand.sum()))
    d = np.array([3.0, 2.0])
    assert np.allclose(water_fill(d, 4.0), water_fill(d, 4.0, np.array([5.0, 5.0])))  # equal weights: max-min fair


def _two_copies(cal, weights):
    """The calibration's two concurrent copies (one per partition of one H200) as predicted by ``simulate``."""
    sh = cal["sharing"]
    nbytes, solo = sh["bytes_per_copy"], sh["solo_copy_s"]
    s = PipelinedSchedule(2, 1, ((RunStep(0, 0, 0),), (RunStep(1, 0, 1),)), {0: 0, 1: 1}, (0, 0), (), "hand")
    mem = MemoryShare({0: nbytes, 1: nbytes}, (nbytes / solo[0], nbytes / solo[1]),
                      {0: sh["whole_gpu_GBps"] * 1e9}, weights)
    r = simulate(s, np.array([[solo[0], solo[0]], [solo[1], solo[1]]]), None, memory=mem)
    return np.array([r.end[0][-1], r.end[1][-1]]), np.array(sh["both_copy_s"])


def test_sm_weighted_sharing_fits_the_measured_two_copies():
    """docs/results/2026-12-01-s9/pipesched_calibration.json: a 2 GiB copy on each of 104 and 24 SMs of one H200 at
    once. SM-weighted shares predict both times within 6 %; equal shares (max-min fair) miss by over 20 %."""
    cal = json.loads(CALIBRATION.read_text())
    sms = [int(d.split("@")[1].rstrip("sm")) for d in cal["devices"]]
    weighted, measured = _two_copies(cal, tuple(sms))
    equal, _ = _two_copies(cal, ())
    assert np.abs(weighted / measured - 1).max() < 0.06, (weighted, measured)
    assert np.abs(equal / measured - 1).max() > 0.2
    assert np.abs(weighted / measured - 1).max() < np.abs(equal / measured - 1).max()


def test_weights_of_the_wrong_length_are_refused():
    dag, costs, s = next(_schedules())
    mem = MemoryShare({}, (4e12, 1.7e12), {0: 4e12}, (104,))
    with pytest.raises(ConfigError, match="weights"):
        simulate(s, costs, None, memory=mem)


def test_planner_model_shares_a_gpus_dram_by_sm_count():
    from torch_tessera.scheduler.pipeline_plan import PipelineModel
    from torch_tessera.target.devices import parse_devices

    model = PipelineModel.from_specs(parse_devices("cuda:0@104sm,cuda:0@24sm", assume_gpu="h200"))
    assert model.share_weights == (104.0, 24.0)
    assert model.domains == (0, 0)
