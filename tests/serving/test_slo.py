"""Summaries and the SLO search, against a queue whose latency is known in closed form."""

from __future__ import annotations

import pytest

from torch_tessera.errors import ConfigError
from torch_tessera.serving import MonitorConfig, PlanCost, Request, ServeConfig, SimulatedEngine, find_max_rate, \
    highest_sustained_rate, make_requests, serve, summarize
from torch_tessera.serving.simcosts import H200_LAYER_US, LLAMA_8B_LAYERS, default_policy_costs
from torch_tessera.serving.sweep import Policy, search_max_rate, sustained_rates, sweep


def _md1_policy() -> Policy:
    # one slot; every request: prefill 20 ms, then one decode step of 20 ms -> deterministic service S = 40 ms
    cost = PlanCost(prefill_s_per_token=0.0, prefill_overhead_s=0.020, decode_base_s=0.020, decode_s_per_seq=0.0)
    return Policy("md1", lambda: SimulatedEngine({"p": cost}), "p")


def test_slo_search_finds_the_md1_crossing():
    # M/D/1 (Pollaczek-Khinchine): mean time in system T = S + rho S / (2 (1 - rho)), rho = rate * S. With S = 40 ms
    # and 2 output tokens, normalized latency T / 2 <= 30 ms  <=>  rho S / (2 (1 - rho)) <= 20 ms  <=>  rho <= 1/2,
    # so the highest rate is 0.5 / 0.040 = 12.5 req/s.
    requests = make_requests([0.0] * 4000, 8, 2)
    rate = search_max_rate(_md1_policy(), requests, 5.0, 24.0, seed=1, config=ServeConfig(buckets=(1,)),
                           slo_s_per_token=0.030, rel_tol=0.005)
    assert rate == pytest.approx(12.5, rel=0.05)


def test_summary_percentiles_and_throughput_by_hand():
    # back to back on one slot, decode 0.1 s per step: request i (3 tokens) runs 0.3 s; arrivals all at 0
    cost = PlanCost(prefill_s_per_token=0.0, prefill_overhead_s=0.1, decode_base_s=0.1, decode_s_per_seq=0.0)
    result = serve(make_requests([0.0] * 4, 1, 3), SimulatedEngine({"p": cost}), "p", ServeConfig(buckets=(1,)))
    s = summarize(result)
    assert s.duration_s == pytest.approx(1.2) and s.throughput_tok_s == pytest.approx(12 / 1.2)
    assert s.tpot_p50_s == pytest.approx(0.1) and s.tpot_p99_s == pytest.approx(0.1)
    # TTFTs 0.1, 0.4, 0.7, 1.0; normalized latencies 0.3/3, 0.6/3, 0.9/3, 1.2/3
    assert s.ttft_p50_s == pytest.approx(0.55) and s.norm_latency_mean_s == pytest.approx(0.25)
    assert s.meets(0.25) and not s.meets(0.2499)


def test_highest_sustained_rate_is_the_first_crossing():
    assert highest_sustained_rate([4, 1, 3, 2], [True, True, False, True]) == 2
    assert highest_sustained_rate([1, 2], [False, True]) is None
    assert highest_sustained_rate([1, 2], [True, True]) == 2


def test_find_max_rate_brackets():
    assert find_max_rate(lambda r: r <= 7.3, 1.0, 20.0, rel_tol=0.001) == pytest.approx(7.3, rel=0.001)
    with pytest.raises(ConfigError, match="low end"):
        find_max_rate(lambda r: False, 1.0, 2.0)
    with pytest.raises(ConfigError, match="raise it"):
        find_max_rate(lambda r: True, 1.0, 2.0)


def test_default_costs_follow_the_measured_profile_and_cross():
    costs = default_policy_costs()
    left = costs["homo-L"].plans["main"]
    b64, b256, prefill = H200_LAYER_US["whole"]
    assert left.decode_s(64) == pytest.approx(b64 * LLAMA_8B_LAYERS * 1e-6)
    assert left.decode_s(256) == pytest.approx(b256 * LLAMA_8B_LAYERS * 1e-6)
    assert left.prefill_s(4096) == pytest.approx(prefill * LLAMA_8B_LAYERS * 1e-6)
    lat, thr = costs["tessera"].plans["latency"], costs["tessera"].plans["throughput"]
    assert costs["tessera"].monitored and not costs["homo-L"].monitored
    assert lat.decode_s(1) < thr.decode_s(1) and thr.decode_s(256) < lat.decode_s(256)


def test_sweep_shows_the_throughput_plan_sustaining_more():
    costs = default_policy_costs()
    policies = [Policy(n, (lambda c=c: SimulatedEngine(c.plans, 0.03)), MonitorConfig() if c.monitored else "main")
                for n, c in costs.items() if n in ("tessera-latency", "tessera-throughput", "tessera")]
    requests = [Request(i, 0.0, 256, 32) for i in range(150)]
    points = sweep(policies, requests, [20, 80, 160], seed=2, slo_s_per_token=0.015)
    by = {(p.policy, p.rate): p for p in points}
    assert len(points) == 9
    low = {name: by[name, 20].summary.norm_latency_mean_s for name in ("tessera-latency", "tessera-throughput")}
    assert low["tessera-latency"] < low["tessera-throughput"]
    sustained = sustained_rates(points)
    assert sustained["tessera-throughput"] > sustained["tessera-latency"]
    assert sustained["tessera"] > sustained["tessera-latency"]  # the monitor moves to the throughput plan in time
    assert by["tessera", 20].summary.switches == 0  # low load: stays on the latency plan...
    assert by["tessera", 20].summary.norm_latency_mean_s == by["tessera-latency", 20].summary.norm_latency_mean_s
    assert by["tessera", 160].summary.switches >= 1
