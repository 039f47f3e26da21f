"""Offline workloads: request input/output lengths like a chat service's, and fixed shape buckets.

The paper (Tessera, sec. 9.2) runs its LLM and SSM benchmarks on the Splitwise conversation trace (Azure LLM inference
trace 2023, conversation service; Patel et al., "Splitwise", ISCA 2024); the artifact's copy has 1000 requests with
**median input 1020 tokens and median output 129 tokens**. The trace is not shipped with this project, so
:func:`conversation_workload` draws lengths from lognormal distributions with those medians:

    input_tokens  ~ round(exp(N(ln 1020, 0.80^2)))   clipped to [1, max_input]
    output_tokens ~ round(exp(N(ln 129,  1.00^2)))   clipped to [1, max_output]

The medians are the trace's (the lognormal's median is ``exp(mu)``). The spreads (sigma 0.80 and 1.00) are our
assumption, not a fit to the trace: they give input p10..p90 of about 370..2850 tokens and output p10..p90 of about
36..460 tokens, the long right tails a chat trace has. Lengths are clipped so that every request fits the largest
bucket. Sampling uses ``numpy.random.default_rng(seed)``: the same seed gives the same workload everywhere.

Compiled shapes are kept to a fixed set: sequence buckets (powers of two, 16 to 8192 tokens by default) and batch
buckets (powers of two, 1 to 256). A request is served in the smallest sequence bucket that holds its prompt and its
output (:meth:`Workload.bucket_of`), so with static KV caches the number of distinct compiled shapes is at most
``len(seq_buckets) * len(batch_buckets)``, whatever the request mix.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from torch_tessera.errors import ConfigError

#: Splitwise conversation trace medians (tokens), as the Tessera artifact reports them.
CONVERSATION_MEDIAN_INPUT = 1020
CONVERSATION_MEDIAN_OUTPUT = 129
#: Lognormal spreads of ln(length): our assumption (see the module docstring), not fitted to the trace.
CONVERSATION_SIGMA_INPUT = 0.80
CONVERSATION_SIGMA_OUTPUT = 1.00

DEFAULT_SEQ_BUCKETS = tuple(2**k for k in range(4, 14))  # 16 .. 8192 tokens
DEFAULT_BATCH_BUCKETS = tuple(2**k for k in range(0, 9))  # 1 .. 256 sequences


@dataclass(frozen=True)
class Request:
    """One generation request (offline batches and online serving use this one type).

    Attributes:
        id: unique id within a workload (offline: its index, from 0); results are keyed by it.
        arrival_s: arrival time, seconds from the start of the run (0 for offline batches: all submitted at once).
        input_tokens: prompt length, tokens (>= 1).
        output_tokens: tokens to generate, including the first one that prefill produces (>= 1); offline runs
            generate exactly this many (no early stop).

    Raises:
        ConfigError: a length below 1, or an arrival time that is negative or not finite.
    """

    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise ConfigError(f"request {self.id}: input_tokens={self.input_tokens} and output_tokens="
                              f"{self.output_tokens} must both be >= 1")
        if not math.isfinite(self.arrival_s) or self.arrival_s < 0:
            raise ConfigError(f"request {self.id}: arrival_s={self.arrival_s} must be a finite time >= 0 seconds")

    @property
    def total_len(self) -> int:
        """Tokens the request's KV cache (or sequence) must hold at the end: ``input_tokens + output_tokens``."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Batch:
    """Requests served together in one compiled shape.

    Attributes:
        requests: the requests (at most ``batch_bucket``; the rest of the bucket is padding).
        batch_bucket: the compiled batch size.
        seq_bucket: the compiled sequence / static-cache length, >= every request's ``total_len``.
    """

    requests: tuple[Request, ...]
    batch_bucket: int
    seq_bucket: int


@dataclass(frozen=True)
class Workload:
    """An offline workload: all requests submitted at once, with the shape buckets they are served in.

    Attributes:
        requests: the requests, ``requests[i].id == i``.
        seq_buckets: sequence lengths compiled for (ascending, tokens).
        batch_buckets: batch sizes compiled for (ascending).
        source: where the length distribution comes from, with its parameters.
        seed: the seed the lengths were drawn with.
    """

    requests: tuple[Request, ...]
    seq_buckets: tuple[int, ...] = DEFAULT_SEQ_BUCKETS
    batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS
    source: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("seq_buckets", "batch_buckets"):
            buckets = getattr(self, name)
            if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
                raise ValueError(f"{name} must be distinct positive integers in ascending order, got {buckets}")
        longest = max((r.total_len for r in self.requests), default=0)
        if longest > self.seq_buckets[-1]:
            raise ValueError(f"a request needs {longest} tokens but the largest sequence bucket is "
                             f"{self.seq_buckets[-1]}; add a bucket or clip the lengths")

    def bucket_of(self, request: Request) -> int:
        """The smallest sequence bucket that holds ``request``'s prompt and output (tokens)."""
        return self.seq_buckets[bisect.bisect_left(self.seq_buckets, request.total_len)]

    def prefill_bucket_of(self, request: Request) -> int:
        """The smallest sequence bucket that holds ``request``'s prompt (the prefill's padded length, tokens)."""
        return self.seq_buckets[bisect.bisect_left(self.seq_buckets, request.input_tokens)]

    def batches(self, max_batch: int) -> tuple[Batch, ...]:
        """Group requests by sequence bucket into batches of at most ``max_batch`` (a batch bucket).

        Within a sequence bucket, requests are taken in id order; a partial last batch is padded up to the smallest
        batch bucket that holds it.
        """
        if max_batch not in self.batch_buckets:
            raise ValueError(f"max_batch={max_batch} is not one of the batch buckets {self.batch_buckets}")
        by_bucket: dict[int, list[Request]] = {}
        for r in self.requests:
            by_bucket.setdefault(self.bucket_of(r), []).append(r)
        out = []
        for seq in sorted(by_bucket):
            group = by_bucket[seq]
            for i in range(0, len(group), max_batch):
                chunk = tuple(group[i:i + max_batch])
                bb = self.batch_buckets[bisect.bisect_left(self.batch_buckets, len(chunk))]
                out.append(Batch(chunk, bb, seq))
        return tuple(out)

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)


def conversation_workload(
    n: int = 1000,
    seed: int = 0,
    *,
    length_scale: float = 1.0,
    seq_buckets: tuple[int, ...] = DEFAULT_SEQ_BUCKETS,
    batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS,
) -> Workload:
    """``n`` requests with conversation-like lengths (see the module docstring for the distribution and its source).

    Args:
        n: number of requests (the paper's artifact uses 1000).
        seed: numpy seed; the same seed gives the same requests.
        length_scale: multiplies both medians, for models with a short context (e.g. ``1/16`` for a tiny model
            whose context is 256 tokens: medians 64 and 8).
        seq_buckets: ascending sequence buckets; lengths are clipped so that ``input + output`` fits the largest
            (output to at most a quarter of it, the input to the rest).
        batch_buckets: ascending batch buckets.

    Returns:
        The workload; request ``i`` has id ``i``.
    """
    if n < 1 or length_scale <= 0:
        raise ValueError(f"need n >= 1 and length_scale > 0, got n={n}, length_scale={length_scale}")
    rng = np.random.default_rng(seed)
    mu_in = math.log(CONVERSATION_MEDIAN_INPUT * length_scale)
    mu_out = math.log(CONVERSATION_MEDIAN_OUTPUT * length_scale)
    inputs = np.rint(rng.lognormal(mu_in, CONVERSATION_SIGMA_INPUT, n))
    outputs = np.rint(rng.lognormal(mu_out, CONVERSATION_SIGMA_OUTPUT, n))
    longest = seq_buckets[-1]
    max_output = max(1, longest // 4)
    outputs = np.clip(outputs, 1, max_output).astype(int)
    inputs = np.clip(inputs, 1, longest - outputs).astype(int)
    source = (f"lognormal lengths with the Splitwise conversation trace's medians x {length_scale:g} "
              f"(input median {CONVERSATION_MEDIAN_INPUT}, sigma {CONVERSATION_SIGMA_INPUT}; output median "
              f"{CONVERSATION_MEDIAN_OUTPUT}, sigma {CONVERSATION_SIGMA_OUTPUT}; sigmas assumed), seed {seed}")
    requests = tuple(Request(i, 0.0, int(a), int(b)) for i, (a, b) in enumerate(zip(inputs, outputs)))
    return Workload(requests, tuple(seq_buckets), tuple(batch_buckets), source, seed)
