"""The plan monitor: switches between the latency plan and the throughput plan by queueing pressure.

The Tessera paper (§III-E; its artifact's ``monitor.py``) measures, over the requests completed in a window of
W = 300 ms, the mean end-to-end latency (finish - arrival, queueing included) and the mean pure execution time, and
runs the throughput-oriented plan while their ratio is >= beta = 1.5, the latency-oriented plan otherwise; it starts on
the latency plan. We keep that rule over a *sliding* window and add hysteresis so the plan does not thrash when the
ratio hovers at the threshold: once on the throughput plan, go back only when the ratio falls below
``back_threshold`` (< ``threshold``), and never switch within ``min_dwell_s`` of the previous switch. With
``back_threshold == threshold`` and ``min_dwell_s == 0`` the rule is the paper's.

An empty window (nothing completed in the last W seconds) keeps the current plan.
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass

from torch_tessera.errors import ConfigError

log = logging.getLogger(__name__)

LATENCY_PLAN = "latency"
THROUGHPUT_PLAN = "throughput"


@dataclass(frozen=True)
class MonitorConfig:
    """Settings of :class:`PlanMonitor`.

    Attributes:
        window_s: length of the sliding window of completions, seconds. Paper default 0.300 (§III-E, Fig. 11).
        threshold: ratio (mean end-to-end latency / mean execution time) at or above which the throughput plan runs.
            Paper default 1.5.
        back_threshold: ratio below which the latency plan comes back; <= ``threshold``. 1.25 is ours (hysteresis).
        min_dwell_s: least time between two switches, seconds. One window by default (ours).
        latency_plan: name of the latency-oriented plan (the initial plan).
        throughput_plan: name of the throughput-oriented plan.
    """

    window_s: float = 0.300
    threshold: float = 1.5
    back_threshold: float = 1.25
    min_dwell_s: float = 0.300
    latency_plan: str = LATENCY_PLAN
    throughput_plan: str = THROUGHPUT_PLAN

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ConfigError(f"monitor window_s={self.window_s} must be > 0 seconds")
        if not self.threshold >= 1.0:
            raise ConfigError(f"monitor threshold={self.threshold} must be >= 1 (the ratio is never below 1 "
                              "without queueing)")
        if not 0 < self.back_threshold <= self.threshold:
            raise ConfigError(f"monitor back_threshold={self.back_threshold} must be in (0, threshold="
                              f"{self.threshold}]; set it equal to threshold for no hysteresis")
        if self.min_dwell_s < 0:
            raise ConfigError(f"monitor min_dwell_s={self.min_dwell_s} must be >= 0 seconds")
        if self.latency_plan == self.throughput_plan:
            raise ConfigError("monitor latency_plan and throughput_plan must name different plans")

    @classmethod
    def paper(cls, window_s: float = 0.300, threshold: float = 1.5) -> "MonitorConfig":
        """The paper's rule: no hysteresis, no dwell."""
        return cls(window_s=window_s, threshold=threshold, back_threshold=threshold, min_dwell_s=0.0)


@dataclass(frozen=True)
class SwitchEvent:
    """One plan switch the monitor decided.

    Attributes:
        time_s: when it was decided, seconds from the start of the run.
        from_plan: plan before.
        to_plan: plan after.
        ratio: the window's ratio that triggered it.
    """

    time_s: float
    from_plan: str
    to_plan: str
    ratio: float


class PlanMonitor:
    """Decides the plan from the completions of a sliding window (see the module docstring).

    Call :meth:`record` for each completed request and :meth:`decide` before each engine step.

    Args:
        config: window, thresholds and plan names.
    """

    def __init__(self, config: MonitorConfig = MonitorConfig()) -> None:
        self.config = config
        self.plan = config.latency_plan
        self.switches: list[SwitchEvent] = []
        self._window: collections.deque[tuple[float, float, float]] = collections.deque()  # (finish, e2e, exec)
        self._sum_e2e = 0.0
        self._sum_exec = 0.0
        self._last_switch_s = -math.inf
        self._last_finish_s = -math.inf

    @property
    def plans(self) -> tuple[str, str]:
        """(latency plan, throughput plan)."""
        return self.config.latency_plan, self.config.throughput_plan

    def record(self, finish_s: float, e2e_s: float, exec_s: float) -> None:
        """Add a completed request: its finish time, end-to-end latency and execution time, seconds."""
        if finish_s < self._last_finish_s:
            raise ConfigError(f"monitor: completions must be recorded in finish order ({finish_s} after "
                              f"{self._last_finish_s})")
        self._last_finish_s = finish_s
        self._window.append((finish_s, e2e_s, exec_s))
        self._sum_e2e += e2e_s
        self._sum_exec += exec_s

    def ratio(self, now_s: float) -> float | None:
        """Mean end-to-end latency over mean execution time of the completions in ``(now - window, now]``, or None
        when there are none."""
        horizon = now_s - self.config.window_s
        while self._window and self._window[0][0] <= horizon:
            _, e2e, ex = self._window.popleft()
            self._sum_e2e -= e2e
            self._sum_exec -= ex
        if not self._window:
            self._sum_e2e = self._sum_exec = 0.0  # drop accumulated rounding
            return None
        if self._sum_exec <= 0:
            return math.inf
        return self._sum_e2e / self._sum_exec

    def decide(self, now_s: float) -> str:
        """The plan to run from ``now_s`` on (switching if the rule says so); records a :class:`SwitchEvent`."""
        ratio = self.ratio(now_s)
        if ratio is None or now_s - self._last_switch_s < self.config.min_dwell_s:
            return self.plan
        cfg = self.config
        if self.plan == cfg.latency_plan and ratio >= cfg.threshold:
            self._switch(now_s, cfg.throughput_plan, ratio)
        elif self.plan == cfg.throughput_plan and ratio < cfg.back_threshold:
            self._switch(now_s, cfg.latency_plan, ratio)
        return self.plan

    def _switch(self, now_s: float, plan: str, ratio: float) -> None:
        self.switches.append(SwitchEvent(now_s, self.plan, plan, ratio))
        log.info("monitor: %s -> %s at %.3f s (ratio %.2f)", self.plan, plan, now_s, ratio)
        self.plan = plan
        self._last_switch_s = now_s
