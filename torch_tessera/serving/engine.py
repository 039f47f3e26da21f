"""The engine interface the serving loop drives, and a simulated engine with per-plan cost figures.

The loop talks to an engine through four calls (:class:`Engine`):

* ``prefill(batch)`` runs the prompts of newly admitted requests and returns each one's first token;
* ``decode(batch)`` runs one decode step for every running request and returns each one's next token;
* ``switch_plan(plan)`` makes ``plan`` the plan of the following steps (both plans are prepared ahead: this swaps
  which pre-built placement/CUDA graphs run, and moves state such as KV caches if the plans keep it apart);
* ``release(request_ids)`` frees the state (KV cache slots) of finished requests.

Each step call returns a :class:`StepResult` with the tokens and the seconds the step took, so the same loop runs a
real engine against the wall clock and a simulated one against a simulated clock. A real engine (the compiled model
under a placement plan) implements these four calls; see :mod:`torch_tessera.serving.compiled_engine`.

Results must depend only on the request: an engine makes a request's prompt token ids from its id (e.g. a generator
seeded by the id), decodes greedily, and gives the same tokens whichever plan ran each step. The loop's tests hold the
loop to that with :class:`SimulatedEngine`, whose token ``k+1`` is a hash of the request id, ``k`` and token ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from torch_tessera.errors import EngineProtocolError, ConfigError  # noqa: F401  (re-exported)


PREFILL = "prefill"
DECODE = "decode"
#: Vocabulary size of the simulated engine's tokens (that of Llama-3's tokenizer; any value works).
SIM_VOCAB = 128_256




@dataclass(frozen=True)
class Batch:
    """One engine step: a prefill of newly admitted requests or a decode step of running ones.

    The per-request tuples are parallel and have one entry per real request (``len(request_ids) <= bucket``); the
    engine pads to ``bucket`` rows itself (the fixed shape its CUDA graph was captured for).

    Attributes:
        kind: ``"prefill"`` or ``"decode"``.
        plan: name of the plan this step runs under (the loop's current plan).
        bucket: padded batch size, one of the loop's buckets.
        request_ids: the requests in this step.
        input_tokens: prompt length of each request, tokens.
        positions: index of the token this step produces for each request: 0 in a prefill, k >= 1 in a decode step
            (the request's context is then ``input_tokens + k`` tokens, ``k - 1`` of them generated before).
        last_tokens: for a decode step, each request's previous token (the step's input); -1 in a prefill.
    """

    kind: str
    plan: str
    bucket: int
    request_ids: tuple[int, ...]
    input_tokens: tuple[int, ...]
    positions: tuple[int, ...]
    last_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        n = len(self.request_ids)
        if self.kind not in (PREFILL, DECODE):
            raise ConfigError(f"Batch kind={self.kind!r} must be {PREFILL!r} or {DECODE!r}")
        if not 0 < n <= self.bucket:
            raise ConfigError(f"Batch of {n} requests does not fit bucket {self.bucket}")
        if not len(self.input_tokens) == len(self.positions) == len(self.last_tokens) == n:
            raise ConfigError("Batch per-request tuples must all have one entry per request")

    @property
    def size(self) -> int:
        """Number of real requests (rows before padding)."""
        return len(self.request_ids)

    @property
    def prompt_tokens(self) -> int:
        """Total prompt tokens of a prefill (0 for a decode step)."""
        return sum(self.input_tokens) if self.kind == PREFILL else 0


@dataclass(frozen=True)
class StepResult:
    """What one engine step returns.

    Attributes:
        tokens: one token id per request of the batch, in the batch's order.
        seconds: time the step took (measured for a real engine, modelled for a simulated one), seconds.
    """

    tokens: tuple[int, ...]
    seconds: float


class Engine(Protocol):
    """What the serving loop needs from an engine. See the module docstring for the contract."""

    def prefill(self, batch: Batch) -> StepResult:
        """Run the prompts of ``batch`` (kind ``"prefill"``); return each request's first token and the time."""

    def decode(self, batch: Batch) -> StepResult:
        """Run one decode step of ``batch`` (kind ``"decode"``); return each request's next token and the time."""

    def switch_plan(self, plan: str) -> float:
        """Make ``plan`` current for the following steps; return the seconds the switch took."""

    def release(self, request_ids: Sequence[int]) -> None:
        """Free the state of finished requests."""


@dataclass(frozen=True)
class PlanCost:
    """Modelled step times of one plan, for :class:`SimulatedEngine`.

    A prefill of ``T`` prompt tokens (packed, as an LLM engine runs varlen prefill) takes
    ``prefill_overhead_s + prefill_s_per_token * T``. A decode step in bucket ``B`` takes
    ``decode_s_by_bucket[B]`` when given, else ``decode_base_s + decode_s_per_seq * B`` (the padded rows cost as much
    as real ones, as with a CUDA graph captured for ``B``). Context length is not modelled.

    A latency-oriented plan has the smaller ``decode_base_s`` (fewer cross-device hops on a step's critical path); a
    throughput-oriented plan the smaller per-sequence cost (work spread over both devices).

    Attributes:
        prefill_s_per_token: seconds per prompt token.
        prefill_overhead_s: fixed seconds per prefill step.
        decode_base_s: fixed seconds per decode step.
        decode_s_per_seq: seconds per (padded) sequence in a decode step.
        decode_s_by_bucket: optional measured seconds per decode step for each bucket size; overrides the line.
    """

    prefill_s_per_token: float
    decode_base_s: float
    decode_s_per_seq: float
    prefill_overhead_s: float = 0.0
    decode_s_by_bucket: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        figures = (self.prefill_s_per_token, self.decode_base_s, self.decode_s_per_seq, self.prefill_overhead_s,
                   *self.decode_s_by_bucket.values())
        if any(not v >= 0 for v in figures):
            raise ConfigError(f"PlanCost figures must be >= 0 seconds, got {self}")
        object.__setattr__(self, "decode_s_by_bucket", {int(k): float(v) for k, v in self.decode_s_by_bucket.items()})

    def prefill_s(self, prompt_tokens: int) -> float:
        """Seconds of a prefill of ``prompt_tokens`` tokens in all."""
        return self.prefill_overhead_s + self.prefill_s_per_token * prompt_tokens

    def decode_s(self, bucket: int) -> float:
        """Seconds of one decode step in bucket ``bucket``."""
        if bucket in self.decode_s_by_bucket:
            return self.decode_s_by_bucket[bucket]
        return self.decode_base_s + self.decode_s_per_seq * bucket


def sim_token(request_id: int, position: int, previous: int) -> int:
    """Token ``position`` of a request in the simulated engine: a hash of the id, the position and the previous token
    (so a skipped, repeated or misrouted step changes every later token)."""
    x = (request_id * 0x9E3779B1 + position * 0x85EBCA77 + (previous + 1) * 0xC2B2AE3D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 12
    return x % SIM_VOCAB


def reference_tokens(request_id: int, output_tokens: int) -> tuple[int, ...]:
    """The tokens :class:`SimulatedEngine` produces for a request run alone (the "eager" result)."""
    tokens: list[int] = []
    previous = -1
    for k in range(output_tokens):
        previous = sim_token(request_id, k, previous)
        tokens.append(previous)
    return tuple(tokens)


def check_batch(batch: Batch, kind: str, plan: str) -> None:
    """What every engine checks of a batch it is asked to run as ``kind`` under its current ``plan``.

    Raises:
        EngineProtocolError: the batch is of another kind, or was formed for another plan than ``plan``.
    """
    if batch.kind != kind:
        raise EngineProtocolError(f"{kind}: got a batch of kind {batch.kind!r}")
    if batch.plan != plan:
        raise EngineProtocolError(f"{kind}: batch runs plan {batch.plan!r} but the engine's plan is "
                                  f"{plan!r}; call switch_plan first")


class SimulatedEngine:
    """An :class:`Engine` whose step times come from per-plan :class:`PlanCost` figures and whose tokens come from
    :func:`sim_token`. It checks the loop: a request prefilled twice, decoded out of order, decoded before prefill or
    after release raises :class:`EngineProtocolError`.

    Args:
        costs: plan name -> cost figures; the loop's plans must be among them.
        switch_cost_s: seconds a plan switch takes.
    """

    def __init__(self, costs: Mapping[str, PlanCost], switch_cost_s: float = 0.0) -> None:
        if not costs:
            raise ConfigError("SimulatedEngine needs the cost figures of at least one plan")
        if switch_cost_s < 0:
            raise ConfigError(f"switch_cost_s={switch_cost_s} must be >= 0 seconds")
        self.costs = dict(costs)
        self.switch_cost_s = switch_cost_s
        self.plan = next(iter(self.costs))
        self._next_position: dict[int, int] = {}  # live request id -> position its next step must produce
        self._released: set[int] = set()
        self.steps = {PREFILL: 0, DECODE: 0}

    def prefill(self, batch: Batch) -> StepResult:
        self._check(batch, PREFILL)
        for rid in batch.request_ids:
            if rid in self._next_position or rid in self._released:
                raise EngineProtocolError(f"prefill: request {rid} was prefilled before")
            self._next_position[rid] = 1
        tokens = tuple(sim_token(rid, 0, -1) for rid in batch.request_ids)
        self.steps[PREFILL] += 1
        return StepResult(tokens, self.costs[batch.plan].prefill_s(batch.prompt_tokens))

    def decode(self, batch: Batch) -> StepResult:
        self._check(batch, DECODE)
        for rid, pos in zip(batch.request_ids, batch.positions):
            if self._next_position.get(rid) != pos:
                raise EngineProtocolError(f"decode: request {rid} asked for token {pos}, expected "
                                          f"{self._next_position.get(rid, 'none (not prefilled or released)')}")
            self._next_position[rid] = pos + 1
        tokens = tuple(sim_token(rid, pos, prev)
                       for rid, pos, prev in zip(batch.request_ids, batch.positions, batch.last_tokens))
        self.steps[DECODE] += 1
        return StepResult(tokens, self.costs[batch.plan].decode_s(batch.bucket))

    def switch_plan(self, plan: str) -> float:
        if plan not in self.costs:
            raise ConfigError(f"plan {plan!r} has no cost figures; known plans: {sorted(self.costs)}")
        self.plan = plan
        return self.switch_cost_s

    def release(self, request_ids: Sequence[int]) -> None:
        for rid in request_ids:
            if self._next_position.pop(rid, None) is None:
                raise EngineProtocolError(f"release: request {rid} is not live")
            self._released.add(rid)

    def _check(self, batch: Batch, kind: str) -> None:
        check_batch(batch, kind, self.plan)
