"""Rate sweeps: run one workload at several Poisson rates under several policies and find each one's SLO crossing."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

from torch_tessera.errors import ConfigError
from torch_tessera.serving.clock import Clock, SimClock
from torch_tessera.serving.engine import Engine
from torch_tessera.serving.loop import ServeConfig, serve
from torch_tessera.serving.metrics import DEFAULT_SLO_S_PER_TOKEN, ServeSummary, find_max_rate, \
    highest_sustained_rate, summarize
from torch_tessera.serving.monitor import MonitorConfig, PlanMonitor
from torch_tessera.serving.workload import Request, with_poisson_arrivals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """A way of serving: an engine and either one plan or the monitor over two.

    Attributes:
        name: shown in tables and plots (``"pd"``, ``"tessera"``...).
        make_engine: returns an engine ready to serve (called once per run; a real engine's factory should reuse
            its compiled plans and only reset per-run state such as KV caches).
        plan: a plan name to run throughout, or the :class:`MonitorConfig` of a monitored policy.
    """

    name: str
    make_engine: Callable[[], Engine]
    plan: str | MonitorConfig

    def run(self, requests: Sequence[Request], config: ServeConfig, clock: Clock) -> ServeSummary:
        """Serve ``requests`` once and summarize."""
        plan = PlanMonitor(self.plan) if isinstance(self.plan, MonitorConfig) else self.plan
        return summarize(serve(requests, self.make_engine(), plan, config, clock))


@dataclass(frozen=True)
class SweepPoint:
    """One policy at one rate.

    Attributes:
        policy: policy name.
        rate: offered Poisson rate, requests/s.
        summary: the run's figures.
        slo_met: whether the mean normalized latency was within the SLO.
    """

    policy: str
    rate: float
    summary: ServeSummary
    slo_met: bool


def sweep(policies: Sequence[Policy], requests: Sequence[Request], rates: Sequence[float], *, seed: int = 0,
          config: ServeConfig = ServeConfig(), slo_s_per_token: float = DEFAULT_SLO_S_PER_TOKEN,
          make_clock: Callable[[], Clock] = SimClock,
          on_point: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
    """Run every policy at every rate on ``requests`` re-timed as a Poisson process (same seed at every rate).

    Args:
        policies: the policies.
        requests: the workload's lengths and ids; their arrival times are replaced.
        rates: Poisson rates, requests/s.
        seed: arrival seed, shared by all rates and policies.
        config: buckets and prefill budget.
        slo_s_per_token: SLO on mean normalized latency, seconds per token.
        make_clock: a fresh clock per run (:class:`SimClock` for simulated engines, ``WallClock`` for real ones).
        on_point: called with each point as soon as it is measured (progress, incremental results: a real sweep
            runs for minutes, and a run stopped part-way keeps what it measured).
    """
    if not policies or not rates:
        raise ConfigError("a sweep needs at least one policy and one rate")
    points = []
    for rate in rates:
        timed = with_poisson_arrivals(requests, rate, seed)
        for policy in policies:
            summary = policy.run(timed, config, make_clock())
            points.append(SweepPoint(policy.name, rate, summary, summary.meets(slo_s_per_token)))
            if on_point is not None:
                on_point(points[-1])
            log.info("%s at %.3g req/s: %.2f ms/token, %d switches", policy.name, rate,
                     summary.norm_latency_mean_s * 1e3, summary.switches)
    return points


def sustained_rates(points: Sequence[SweepPoint]) -> dict[str, float | None]:
    """Policy -> highest swept rate up to which the SLO held (None if it failed at the lowest)."""
    names = list(dict.fromkeys(p.policy for p in points))
    return {n: highest_sustained_rate([p.rate for p in points if p.policy == n],
                                      [p.slo_met for p in points if p.policy == n]) for n in names}


def search_max_rate(policy: Policy, requests: Sequence[Request], lo: float, hi: float, *, seed: int = 0,
                    config: ServeConfig = ServeConfig(), slo_s_per_token: float = DEFAULT_SLO_S_PER_TOKEN,
                    rel_tol: float = 0.01, make_clock: Callable[[], Clock] = SimClock) -> float:
    """Bisect for the highest Poisson rate (requests/s) at which ``policy`` meets the SLO, between ``lo`` and ``hi``
    (see :func:`~torch_tessera.serving.metrics.find_max_rate`)."""
    def meets_at(rate: float) -> bool:
        timed = with_poisson_arrivals(requests, rate, seed)
        return policy.run(timed, config, make_clock()).meets(slo_s_per_token)

    return find_max_rate(meets_at, lo, hi, rel_tol=rel_tol)
