"""What a captured call costs outside its graph (``scheduler.issue.CallCost`` through ``simulate(graph=...)``): added
to the step and to each device's idle time, exactly; nothing changes without it; bad values are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import random_schedules
from torch_tessera.errors import ConfigError
from torch_tessera.scheduler.issue import CallCost, GraphIssue
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RecordStep, RunStep, WaitStep
from torch_tessera.scheduler.simulate import MemoryShare, simulate
from torch_tessera.scheduler.synthetic import nvlink_topology

US = 1e-6


def _hand() -> tuple[PipelinedSchedule, np.ndarray]:
    """Device 0: launches 0 (10 us), 1 (5 us), a record; device 1 waits for it, then launch 2 (4 us)."""
    s0 = (RunStep(0, 0, 0), RunStep(0, 0, 1), RecordStep(0, 0, 7))
    s1 = (WaitStep(1, 0, 7, ((1, 2),)), RunStep(1, 0, 2))
    costs = np.zeros((3, 2))
    costs[:, 0] = costs[:, 1] = np.array([10, 5, 4]) * US
    return PipelinedSchedule(2, 1, (s0, s1), {0: 0, 1: 0, 2: 1}, (0, 0), ((1, 2),), "hand"), costs


def test_hand_case():
    """Overlap 1 us: device 0 runs 10 + 4 us, device 1 waits (0.5 us) then runs 4 us (after a wait: whole): 18.5 us;
    the call adds 3 us of host and 2 x 1 MB at 1 TB/s = 2 us."""
    s, costs = _hand()
    call = CallCost(host=3 * US, copy_bytes=1e6, bandwidth=1e12, source="test")
    assert call.seconds == pytest.approx(5 * US, rel=1e-12)
    base = simulate(s, costs, None, wait_seconds=0.5 * US, graph=GraphIssue(overlap=1 * US))
    got = simulate(s, costs, None, wait_seconds=0.5 * US, graph=GraphIssue(overlap=1 * US, call=call))
    assert base.step_seconds == pytest.approx(18.5 * US, rel=1e-12)
    assert got.step_seconds == pytest.approx(23.5 * US, rel=1e-12)


@pytest.mark.parametrize("shared", [False, True], ids=["longest-path", "event-loop"])
def test_adds_exactly_its_seconds_and_nothing_else(shared):
    topo = nvlink_topology(["a", "b"])
    call = CallCost(host=120 * US, copy_bytes=3e6, bandwidth=4e12)
    for dag, costs, s in random_schedules(4):
        mem = None
        if shared:
            mem = MemoryShare({n: 1e6 for n in dag.graph.nodes}, (4e12, 1.7e12), {0: 3e12, 1: 3e12}, (104, 24), 0.75)
        kw = dict(wait_seconds=1e-6, memory=mem)
        base = simulate(s, costs, topo, graph=GraphIssue(), **kw)
        got = simulate(s, costs, topo, graph=GraphIssue(call=call), **kw)
        assert got.step_seconds == pytest.approx(base.step_seconds + call.seconds, rel=1e-12)
        assert np.allclose(got.idle, base.idle + call.seconds, rtol=0, atol=1e-15)
        for a in ("busy", "transfer", "waiting", "stretch"):
            assert np.array_equal(getattr(got, a), getattr(base, a)), a
        assert all(np.array_equal(x, y) for x, y in zip(got.end, base.end))
        none = simulate(s, costs, topo, graph=GraphIssue(call=None), **kw)
        assert none.step_seconds == base.step_seconds  # bit for bit: no call, no change


@pytest.mark.parametrize("kwargs, name", [({"host": -1e-6}, "host"), ({"copy_bytes": float("nan")}, "copy_bytes"),
                                          ({"bandwidth": 0.0}, "bandwidth")])
def test_bad_values_are_refused_by_name(kwargs, name):
    with pytest.raises(ConfigError, match=f"CallCost.{name}="):
        CallCost(**kwargs)
    with pytest.raises(ConfigError, match="GraphIssue.call="):
        GraphIssue(call=5e-4)
