"""The plan monitor: threshold, hysteresis, dwell, and switches that lose, repeat or change nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from torch_tessera.errors import ConfigError
from torch_tessera.serving import Batch, MonitorConfig, PlanCost, PlanMonitor, Request, ServeConfig, SimulatedEngine, \
    StepResult, make_requests, reference_tokens, serve

LAT, THR = "latency", "throughput"


def test_switches_at_the_threshold_not_before():
    m = PlanMonitor(MonitorConfig.paper(window_s=0.3, threshold=1.5))
    m.record(0.10, 0.25, 0.25)          # ratio 1
    assert m.decide(0.10) == LAT
    m.record(0.20, 0.49975, 0.25)       # (0.25 + 0.49975) / 0.5 = 1.4995
    assert m.ratio(0.20) == pytest.approx(1.4995) and m.decide(0.20) == LAT and not m.switches
    m.record(0.21, 0.37525, 0.25)       # three completions: (0.25 + 0.49975 + 0.37525) / 0.75 = 1.5 exactly
    assert m.ratio(0.21) == 1.5
    assert m.decide(0.21) == THR
    (event,) = m.switches
    assert (event.time_s, event.from_plan, event.to_plan, event.ratio) == (0.21, LAT, THR, 1.5)


def test_window_forgets_old_completions_and_empty_window_keeps_the_plan():
    m = PlanMonitor(MonitorConfig.paper(window_s=0.25))
    m.record(1.0, 1.0, 0.25)            # ratio 4, but only until 1.25 s
    assert m.ratio(1.24) == 4.0
    assert m.ratio(1.25) is None        # the window is (now - 0.25, now]
    assert m.decide(1.25) == LAT and not m.switches
    with pytest.raises(ConfigError, match="finish order"):
        m.record(0.5, 1.0, 1.0)


def _oscillating_ratio_feed(monitor: PlanMonitor, periods: int = 10, period_s: float = 0.6) -> None:
    """A completion every 10 ms whose latency/execution ratio is 1.5 + 0.1 sin(2 pi t / period): the 300 ms window's
    ratio swings about 1.5 by +-0.064 (a moving average over half a period keeps 2/pi of the amplitude)."""
    for t in np.arange(0.01, periods * period_s, 0.01):
        monitor.record(t, 0.1 * (1.5 + 0.1 * math.sin(2 * math.pi * t / period_s)), 0.1)
        monitor.decide(t)


def test_hysteresis_stops_thrashing_under_an_oscillating_load():
    paper = PlanMonitor(MonitorConfig.paper())
    _oscillating_ratio_feed(paper)
    assert len(paper.switches) >= 17  # crosses 1.5 twice per period over 10 periods
    ours = PlanMonitor(MonitorConfig())  # back at 1.25, dwell 300 ms
    _oscillating_ratio_feed(ours)
    assert [(e.from_plan, e.to_plan) for e in ours.switches] == [(LAT, THR)]
    assert ours.switches[0].ratio >= 1.5


def test_min_dwell_spaces_switches():
    m = PlanMonitor(MonitorConfig(back_threshold=1.5, min_dwell_s=1.0))
    _oscillating_ratio_feed(m)
    times = [e.time_s for e in m.switches]
    assert len(times) >= 3 and min(np.diff(times)) >= 1.0


def test_monitor_config_rejects_inverted_hysteresis():
    with pytest.raises(ConfigError, match="back_threshold"):
        MonitorConfig(threshold=1.5, back_threshold=1.6)
    with pytest.raises(ConfigError, match="window_s"):
        MonitorConfig(window_s=0.0)


class _PlanLog(SimulatedEngine):
    """Records which plan each prefilled request ran under."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prefill_plan: dict[int, str] = {}

    def prefill(self, batch: Batch) -> StepResult:
        self.prefill_plan.update({rid: batch.plan for rid in batch.request_ids})
        return super().prefill(batch)


@pytest.mark.parametrize("threshold, first_switch_s", [(1.5, 0.25), (1.5001, 0.375)])
def test_loop_switches_when_the_window_first_reaches_the_threshold(threshold, first_switch_s):
    # one slot, every request at t=0, one token each, prefill 0.125 s: request k finishes at 0.125 (k+1) and the
    # window's ratio after it is mean(e2e) / mean(exec) = 1, 1.5, 2, 3, ... (the last three completions)
    cost = PlanCost(prefill_s_per_token=0.125 / 8, decode_base_s=0.0, decode_s_per_seq=0.0)
    eng = _PlanLog({LAT: cost, THR: cost})
    result = serve(make_requests([0.0] * 6, 8, 1), eng, PlanMonitor(MonitorConfig.paper(0.3, threshold)),
                   ServeConfig(buckets=(1,)))
    assert result.switches[0].time_s == first_switch_s
    assert all(e.to_plan == THR for e in result.switches)  # ratio only grows: never back
    on_latency = round(first_switch_s / 0.125)
    assert [eng.prefill_plan[i] for i in range(6)] == [LAT] * on_latency + [THR] * (6 - on_latency)


def _bursty_requests(n: int = 240, seed: int = 5) -> list[Request]:
    """Bursts of 30 requests within 50 ms every 1.5 s, lengths varying per request."""
    rng = np.random.default_rng(seed)
    arrivals = [(i // 30) * 1.5 + rng.uniform(0, 0.05) for i in range(n)]
    return list(make_requests(arrivals, rng.integers(16, 400, n).tolist(), rng.integers(1, 60, n).tolist()))


def _two_plan_engine(switch_cost_s: float) -> SimulatedEngine:
    return SimulatedEngine({LAT: PlanCost(2e-5, 0.004, 4e-4), THR: PlanCost(1e-5, 0.008, 1e-4)}, switch_cost_s)


def test_switching_never_drops_duplicates_or_changes_a_request():
    reqs = _bursty_requests()
    thrashing = PlanMonitor(MonitorConfig.paper(window_s=0.03))
    switched = serve(reqs, _two_plan_engine(0.005), thrashing, ServeConfig(buckets=(1, 2, 4, 8, 16)))
    fixed = serve(reqs, _two_plan_engine(0.005), LAT, ServeConfig(buckets=(1, 2, 4, 8, 16)))
    assert len(switched.switches) >= 10
    assert switched.switch_s == pytest.approx(0.005 * len(switched.switches))
    ids = [r.id for r in switched.results]
    assert sorted(ids) == list(range(len(reqs))) and len(set(ids)) == len(ids)
    for r, req in zip(switched.results, reqs):
        assert r.request == req and r.tokens == reference_tokens(req.id, req.output_tokens)
    assert [r.tokens for r in switched.results] == [r.tokens for r in fixed.results]
    assert {THR, LAT} <= set(switched.plan_step_s)


def test_hysteresis_cuts_switches_in_the_loop():
    reqs = _bursty_requests()
    runs = {name: serve(reqs, _two_plan_engine(0.005), PlanMonitor(cfg), ServeConfig(buckets=(1, 2, 4, 8, 16)))
            for name, cfg in (("paper", MonitorConfig.paper(window_s=0.1)),
                              ("ours", MonitorConfig(window_s=0.1, min_dwell_s=0.3)))}
    paper, ours = (len(runs[k].switches) for k in ("paper", "ours"))
    assert ours * 3 <= paper
    assert ours <= 2 * 8  # at most one round trip per burst (240 requests in bursts of 30)
    gaps = np.diff([e.time_s for e in runs["ours"].switches])
    assert gaps.size == 0 or gaps.min() >= 0.3
