"""Online serving: arrivals, a continuous-batching loop over an abstract engine, and the plan monitor.

Entry points: :func:`~torch_tessera.serving.loop.serve` runs a workload on an engine under one plan or a
:class:`~torch_tessera.serving.monitor.PlanMonitor`; :func:`~torch_tessera.serving.metrics.summarize` and
:func:`~torch_tessera.serving.metrics.find_max_rate` turn runs into the paper's online figures. Nothing here needs a
GPU: :class:`~torch_tessera.serving.engine.SimulatedEngine` with :class:`~torch_tessera.serving.clock.SimClock` runs the
whole loop on modelled step times.
"""

from torch_tessera.serving.clock import SimClock, WallClock
from torch_tessera.serving.engine import Batch, Engine, EngineProtocolError, PlanCost, SimulatedEngine, StepResult, \
    reference_tokens
from torch_tessera.serving.loop import RequestResult, ServeConfig, ServeResult, serve
from torch_tessera.serving.metrics import DEFAULT_SLO_S_PER_TOKEN, ServeSummary, find_max_rate, \
    highest_sustained_rate, summarize
from torch_tessera.serving.monitor import LATENCY_PLAN, THROUGHPUT_PLAN, MonitorConfig, PlanMonitor, SwitchEvent
from torch_tessera.serving.workload import Request, load_trace, make_requests, poisson_arrivals, poisson_workload, \
    save_trace, with_poisson_arrivals

__all__ = [
    "Batch", "DEFAULT_SLO_S_PER_TOKEN", "Engine", "EngineProtocolError", "LATENCY_PLAN", "MonitorConfig", "PlanCost",
    "PlanMonitor", "Request", "RequestResult", "ServeConfig", "ServeResult", "ServeSummary", "SimClock",
    "SimulatedEngine", "StepResult", "SwitchEvent", "THROUGHPUT_PLAN", "WallClock", "find_max_rate",
    "highest_sustained_rate", "load_trace", "make_requests", "poisson_arrivals", "poisson_workload",
    "reference_tokens", "save_trace", "serve", "summarize", "with_poisson_arrivals",
]
