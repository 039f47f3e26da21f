"""The request-level serving loop: continuous batching within fixed batch buckets, one plan or a monitor's choice.

Each iteration of :func:`serve`:

1. moves the requests that have arrived into the waiting queue (idles until the next arrival when nothing is left);
2. asks the monitor, if any, for the plan, and switches the engine when it changes (charging the switch's seconds);
3. admits waiting requests, first come first served, into the free slots of the largest bucket, up to
   ``max_prefill_tokens`` prompt tokens (at least one request), and prefills them as one batch: their first tokens;
4. runs one decode step over every running request, padded to the smallest bucket that holds them;
5. retires requests that have all their output tokens, releases their state and reports them to the monitor.

Prefill and decode steps of one engine run one after the other (no overlap of the two). A request's execution time is
the summed time of the steps it was in; its end-to-end latency also counts the time it waited in the queue and while
other requests' prefills ran. Their ratio over a window is what the monitor watches.
"""

from __future__ import annotations

import bisect
import collections
import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

from torch_tessera.errors import ConfigError
from torch_tessera.serving.clock import Clock, SimClock
from torch_tessera.serving.engine import DECODE, PREFILL, Batch, Engine, EngineProtocolError
from torch_tessera.serving.monitor import PlanMonitor, SwitchEvent
from torch_tessera.serving.workload import Request

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class ServeConfig:
    """Batching limits of the loop.

    Attributes:
        buckets: allowed padded batch sizes, ascending; the largest is the number of request slots.
        max_prefill_tokens: prompt tokens admitted into one prefill step (a longer single prompt still runs alone).
    """

    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    max_prefill_tokens: int = 8192

    def __post_init__(self) -> None:
        b = tuple(int(x) for x in self.buckets)
        if not b or any(x < 1 for x in b) or list(b) != sorted(set(b)):
            raise ConfigError(f"buckets={self.buckets} must be distinct positive batch sizes in ascending order")
        object.__setattr__(self, "buckets", b)
        if self.max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens={self.max_prefill_tokens} must be >= 1")

    @property
    def slots(self) -> int:
        """Most requests running at once."""
        return self.buckets[-1]

    def bucket_for(self, n: int) -> int:
        """Smallest bucket holding ``n`` requests."""
        return self.buckets[bisect.bisect_left(self.buckets, n)]


@dataclass(frozen=True)
class RequestResult:
    """One request served.

    Attributes:
        request: the request.
        first_token_s: time its first token came out of prefill, seconds from the start of the run.
        finish_s: time its last token came out, seconds.
        exec_s: summed time of the engine steps it was in, seconds.
        tokens: its output token ids, ``request.output_tokens`` of them.
    """

    request: Request
    first_token_s: float
    finish_s: float
    exec_s: float
    tokens: tuple[int, ...]

    @property
    def id(self) -> int:
        return self.request.id

    @property
    def ttft_s(self) -> float:
        """Time to first token (queueing included), seconds."""
        return self.first_token_s - self.request.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first, seconds; NaN for a one-token request."""
        n = self.request.output_tokens
        return (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else math.nan

    @property
    def e2e_s(self) -> float:
        """End-to-end latency (finish - arrival), seconds."""
        return self.finish_s - self.request.arrival_s

    @property
    def normalized_latency_s(self) -> float:
        """End-to-end latency divided by output tokens, seconds per token (the paper's normalized latency)."""
        return self.e2e_s / self.request.output_tokens


@dataclass(frozen=True)
class ServeResult:
    """Everything a run produced.

    Attributes:
        results: one per request, ordered by id.
        switches: the plan switches, in time order.
        switch_s: total seconds spent switching plans.
        plan_step_s: plan name -> engine seconds spent in steps under that plan.
        steps: ``{"prefill": n, "decode": m}`` engine steps run.
        end_s: time the last request finished, seconds.
    """

    results: tuple[RequestResult, ...]
    switches: tuple[SwitchEvent, ...]
    switch_s: float
    plan_step_s: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    end_s: float = 0.0


class _Live:
    """Mutable state of one request inside the loop."""

    __slots__ = ("request", "tokens", "first_token_s", "exec_s")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.tokens: list[int] = []
        self.first_token_s = math.nan
        self.exec_s = 0.0


def serve(requests: Sequence[Request], engine: Engine, plan: str | PlanMonitor,
          config: ServeConfig = ServeConfig(), clock: Clock | None = None) -> ServeResult:
    """Serve ``requests`` on ``engine`` until every one has finished.

    Args:
        requests: the workload; ids must be unique. Arrival times are seconds on ``clock``.
        engine: the engine (see :class:`~torch_tessera.serving.engine.Engine`).
        plan: a plan name to run throughout, or a :class:`PlanMonitor` that picks between its two plans.
        config: buckets and prefill budget.
        clock: :class:`SimClock` (default, starting at 0) for a simulated engine, :class:`WallClock` for a real one.

    Returns:
        the per-request results and the switches.
    """
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        dup = sorted(i for i, c in collections.Counter(ids).items() if c > 1)[:5]
        raise ConfigError(f"request ids must be unique; repeated: {dup}")
    clock = clock or SimClock()
    monitor = plan if isinstance(plan, PlanMonitor) else None
    current = monitor.plan if monitor else plan
    engine.switch_plan(current)  # set-up, not charged
    pending = collections.deque(sorted(requests, key=lambda r: (r.arrival_s, r.id)))
    waiting: collections.deque[_Live] = collections.deque()
    running: dict[int, _Live] = {}
    done: list[RequestResult] = []
    switches: list[SwitchEvent] = []
    switch_s = 0.0
    plan_step_s: dict[str, float] = collections.defaultdict(float)
    steps = {PREFILL: 0, DECODE: 0}

    while pending or waiting or running:
        now = clock.now()
        while pending and pending[0].arrival_s <= now:
            waiting.append(_Live(pending.popleft()))
        if not waiting and not running:
            clock.wait_until(pending[0].arrival_s)
            continue
        if monitor is not None and monitor.decide(now) != current:
            event = monitor.switches[-1]
            seconds = engine.switch_plan(event.to_plan)
            clock.advance(seconds)
            switch_s += seconds
            switches.append(event)
            current = event.to_plan
        if waiting and len(running) < config.slots:
            batch_live = _admit(waiting, config.slots - len(running), config.max_prefill_tokens)
            batch = _batch(PREFILL, current, config, batch_live)
            seconds = _step(engine.prefill, batch, batch_live, clock)
            plan_step_s[current] += seconds
            steps[PREFILL] += 1
            for live in batch_live:
                live.first_token_s = clock.now()
                running[live.request.id] = live
            _retire(running, engine, monitor, done, clock.now())
        if running:
            batch_live = list(running.values())
            batch = _batch(DECODE, current, config, batch_live)
            plan_step_s[current] += _step(engine.decode, batch, batch_live, clock)
            steps[DECODE] += 1
            _retire(running, engine, monitor, done, clock.now())

    done.sort(key=lambda r: r.id)
    end_s = max((r.finish_s for r in done), default=0.0)
    log.info("served %d requests in %.3f s: %d prefill and %d decode steps, %d plan switches (%.3f s)",
             len(done), end_s, steps[PREFILL], steps[DECODE], len(switches), switch_s)
    return ServeResult(tuple(done), tuple(switches), switch_s, dict(plan_step_s), steps, end_s)


def _admit(waiting: collections.deque[_Live], free: int, token_budget: int) -> list[_Live]:
    admitted = [waiting.popleft()]
    tokens = admitted[0].request.input_tokens
    while waiting and len(admitted) < free and tokens + waiting[0].request.input_tokens <= token_budget:
        tokens += waiting[0].request.input_tokens
        admitted.append(waiting.popleft())
    return admitted


def _batch(kind: str, plan: str, config: ServeConfig, lives: list[_Live]) -> Batch:
    return Batch(kind=kind, plan=plan, bucket=config.bucket_for(len(lives)),
                 request_ids=tuple(x.request.id for x in lives),
                 input_tokens=tuple(x.request.input_tokens for x in lives),
                 positions=tuple(len(x.tokens) for x in lives),
                 last_tokens=tuple(x.tokens[-1] if x.tokens else -1 for x in lives))


def _step(call, batch: Batch, lives: list[_Live], clock: Clock) -> float:
    result = call(batch)
    if len(result.tokens) != batch.size or not result.seconds >= 0:
        raise EngineProtocolError(f"{batch.kind}: engine returned {len(result.tokens)} tokens for {batch.size} "
                                  f"requests and {result.seconds} seconds; it must return one token per request and "
                                  "a time >= 0")
    clock.advance(result.seconds)
    for live, token in zip(lives, result.tokens):
        live.tokens.append(int(token))
        live.exec_s += result.seconds
    return result.seconds


def _retire(running: dict[int, _Live], engine: Engine, monitor: PlanMonitor | None, done: list[RequestResult],
            now: float) -> None:
    finished = [x for x in running.values() if len(x.tokens) >= x.request.output_tokens]
    if not finished:
        return
    for live in finished:
        del running[live.request.id]
        result = RequestResult(live.request, live.first_token_s, now, live.exec_s, tuple(live.tokens))
        done.append(result)
        if monitor is not None:
            monitor.record(now, result.e2e_s, result.exec_s)
    engine.release([x.request.id for x in finished])
