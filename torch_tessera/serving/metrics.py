"""Summaries of a serving run, and the search for the highest request rate that meets a latency SLO.

The paper's online metric (§V, Fig. 7) is the *normalized latency*, end-to-end latency divided by output tokens, with
an SLO of 50 ms/token, reported as the highest request rate whose normalized latency stays under it; beside it P99
TTFT and P99 TPOT. We take the mean normalized latency over all requests of a run (the paper plots the mean).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from torch_tessera.errors import ConfigError
from torch_tessera.serving.loop import ServeResult

log = logging.getLogger(__name__)

#: Default SLO on mean normalized latency, seconds per output token (the paper's 50 ms/token).
DEFAULT_SLO_S_PER_TOKEN = 0.050


@dataclass(frozen=True)
class ServeSummary:
    """Headline figures of one run.

    Attributes:
        requests: requests served.
        duration_s: first arrival to last finish, seconds.
        throughput_tok_s: output tokens per second over ``duration_s``.
        throughput_req_s: requests per second over ``duration_s``.
        ttft_p50_s, ttft_p99_s: percentiles of time to first token, seconds.
        tpot_p50_s, tpot_p99_s: percentiles of time per output token after the first, seconds (NaN if no request had
            more than one output token).
        norm_latency_mean_s: mean normalized latency, seconds per token.
        norm_latency_p99_s: 99th percentile of normalized latency, seconds per token.
        switches: plan switches.
        switch_s: seconds spent switching.
    """

    requests: int
    duration_s: float
    throughput_tok_s: float
    throughput_req_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    norm_latency_mean_s: float
    norm_latency_p99_s: float
    switches: int
    switch_s: float

    def meets(self, slo_s_per_token: float = DEFAULT_SLO_S_PER_TOKEN) -> bool:
        """Whether the mean normalized latency is within ``slo_s_per_token`` seconds per token."""
        return self.norm_latency_mean_s <= slo_s_per_token

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(result: ServeResult) -> ServeSummary:
    """The :class:`ServeSummary` of a run."""
    rs = result.results
    if not rs:
        raise ConfigError("cannot summarize a run with no requests")
    start = min(r.request.arrival_s for r in rs)
    duration = max(result.end_s - start, 1e-12)
    ttft = np.array([r.ttft_s for r in rs])
    tpot = np.array([r.tpot_s for r in rs if r.request.output_tokens > 1])
    norm = np.array([r.normalized_latency_s for r in rs])
    tokens = sum(r.request.output_tokens for r in rs)
    return ServeSummary(
        requests=len(rs), duration_s=duration, throughput_tok_s=tokens / duration, throughput_req_s=len(rs) / duration,
        ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99), tpot_p50_s=_pct(tpot, 50), tpot_p99_s=_pct(tpot, 99),
        norm_latency_mean_s=float(norm.mean()), norm_latency_p99_s=_pct(norm, 99),
        switches=len(result.switches), switch_s=result.switch_s)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def highest_sustained_rate(rates: Sequence[float], met: Sequence[bool]) -> float | None:
    """The highest swept rate below which every swept rate met the SLO (the first crossing), or None if the lowest
    rate already failed.

    Args:
        rates: request rates, requests/s, in any order.
        met: whether the SLO held at each rate.
    """
    best = None
    for rate, ok in sorted(zip(rates, met)):
        if not ok:
            break
        best = rate
    return best


def find_max_rate(meets_at: Callable[[float], bool], lo: float, hi: float, rel_tol: float = 0.01,
                  max_iter: int = 40) -> float:
    """Bisect for the highest rate at which ``meets_at(rate)`` holds, assuming it holds below some rate and fails
    above it (true for a latency SLO when arrivals at different rates share a seed, see
    :func:`~torch_tessera.serving.workload.poisson_arrivals`).

    Args:
        meets_at: runs the workload at a rate (requests/s) and says whether the SLO held.
        lo: a rate known (or expected) to meet the SLO, requests/s (> 0).
        hi: a rate known (or expected) to fail, requests/s (> lo).
        rel_tol: stop when ``hi / lo - 1 <= rel_tol``.
        max_iter: most bisection steps.

    Returns:
        the highest rate found to meet the SLO (within ``rel_tol`` of the crossing).

    Raises:
        ConfigError: ``lo`` fails, or ``hi`` meets the SLO: the bracket does not contain the crossing; widen it.
    """
    if not 0 < lo < hi:
        raise ConfigError(f"find_max_rate needs 0 < lo < hi, got lo={lo}, hi={hi}")
    if not meets_at(lo):
        raise ConfigError(f"the SLO already fails at the low end of the bracket ({lo} req/s); lower it")
    if meets_at(hi):
        raise ConfigError(f"the SLO still holds at the high end of the bracket ({hi} req/s); raise it")
    for _ in range(max_iter):
        if hi / lo - 1 <= rel_tol:
            break
        mid = math.sqrt(lo * hi)
        if meets_at(mid):
            lo = mid
        else:
            hi = mid
    log.info("highest rate meeting the SLO: %.4g req/s (failing at %.4g)", lo, hi)
    return lo
