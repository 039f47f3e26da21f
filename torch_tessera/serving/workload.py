"""Requests and the processes that bring them: Poisson arrivals at a given rate, or replay of a trace file.

A request is only its arrival time and its lengths (input tokens, output tokens); the engine makes up the prompt's
token ids from the request id (see :mod:`torch_tessera.serving.engine`), so that a trace of lengths is enough to
drive any model.

Trace files (one request per row or line):

* CSV with a header naming ``arrival_s``, ``input_tokens`` and ``output_tokens`` (aliases: ``arrival``,
  ``timestamp``, ``time``; ``input_len``, ``prompt_tokens``, ``ContextTokens``; ``output_len``, ``GeneratedTokens``,
  the last two being the Splitwise/Azure trace's columns). Arrival times are seconds unless a ``TIMESTAMP`` column of
  ISO dates is given, in which case they are taken relative to the first row.
* JSONL with one object per line with the same keys.

Rows with no arrival column get arrival 0 (all submitted at once: the offline setting).
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import pathlib
from dataclasses import replace
from typing import Iterable, Sequence

import numpy as np

from torch_tessera.errors import ConfigError
from torch_tessera.workloads import Request  # the one request type (offline and online)

_ARRIVAL_KEYS = ("arrival_s", "arrival", "timestamp", "time")
_INPUT_KEYS = ("input_tokens", "input_len", "prompt_tokens", "contexttokens")
_OUTPUT_KEYS = ("output_tokens", "output_len", "generatedtokens")


def poisson_arrivals(rate: float, count: int, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process: ``count`` times in seconds, the first one exponential after 0.

    The exponential gaps are drawn with unit mean and divided by ``rate``, so the same seed at different rates gives
    the same arrivals scaled in time (common random numbers: a latency-vs-rate curve is then smooth and monotone in
    the rate, which the SLO search relies on).

    Args:
        rate: mean arrivals per second (> 0).
        count: number of arrivals.
        seed: seed of the numpy generator.
    """
    if not rate > 0 or not math.isfinite(rate):
        raise ConfigError(f"Poisson rate={rate} must be a positive, finite number of requests per second")
    gaps = np.random.default_rng(seed).exponential(1.0, size=count)
    return np.cumsum(gaps) / rate


def make_requests(arrivals: Sequence[float], input_tokens: int | Sequence[int],
                  output_tokens: int | Sequence[int]) -> tuple[Request, ...]:
    """Requests with ids 0..n-1 at the given arrival times (seconds), lengths fixed or one per request (cycled)."""
    ins = [input_tokens] if isinstance(input_tokens, int) else list(input_tokens)
    outs = [output_tokens] if isinstance(output_tokens, int) else list(output_tokens)
    if not ins or not outs:
        raise ConfigError("make_requests needs at least one input length and one output length")
    return tuple(Request(i, float(t), int(ins[i % len(ins)]), int(outs[i % len(outs)]))
                 for i, t in enumerate(arrivals))


def poisson_workload(rate: float, count: int, input_tokens: int | Sequence[int], output_tokens: int | Sequence[int],
                     seed: int = 0) -> tuple[Request, ...]:
    """``count`` requests arriving as a Poisson process at ``rate`` requests/s (see :func:`poisson_arrivals`)."""
    return make_requests(poisson_arrivals(rate, count, seed), input_tokens, output_tokens)


def with_poisson_arrivals(requests: Sequence[Request], rate: float, seed: int = 0) -> tuple[Request, ...]:
    """The same requests (lengths, ids, order) re-timed as a Poisson process at ``rate`` requests/s."""
    times = poisson_arrivals(rate, len(requests), seed)
    return tuple(replace(r, arrival_s=float(t)) for r, t in zip(requests, times))


def load_trace(path: str | pathlib.Path) -> tuple[Request, ...]:
    """Read a trace file (CSV or JSONL, by extension: ``.jsonl``/``.json`` is JSONL, anything else CSV).

    Returns requests sorted by arrival, with ids in file order. Arrival times are shifted so the first is 0.

    Raises:
        ConfigError: the file is missing, a required column is absent, or a value is not a number; the message names
            the file, the line and the accepted column names.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"trace file {path} does not exist")
    rows = list(_jsonl_rows(path) if path.suffix in (".jsonl", ".json") else _csv_rows(path))
    if not rows:
        raise ConfigError(f"trace file {path} has no requests")
    parsed = [_parse_row(path, line, row) for line, row in rows]
    t0 = min(t for t, _, _ in parsed)
    requests = [Request(i, t - t0, n_in, n_out) for i, (t, n_in, n_out) in enumerate(parsed)]
    return tuple(sorted(requests, key=lambda r: (r.arrival_s, r.id)))


def save_trace(path: str | pathlib.Path, requests: Iterable[Request]) -> None:
    """Write requests as a trace (CSV or JSONL by extension) that :func:`load_trace` reads back."""
    path = pathlib.Path(path)
    fields = ("arrival_s", "input_tokens", "output_tokens")
    with path.open("w", newline="") as f:
        if path.suffix in (".jsonl", ".json"):
            for r in requests:
                f.write(json.dumps({k: getattr(r, k) for k in fields}) + "\n")
        else:
            w = csv.writer(f)
            w.writerow(fields)
            w.writerows([repr(r.arrival_s), r.input_tokens, r.output_tokens] for r in requests)


def _csv_rows(path: pathlib.Path) -> Iterable[tuple[int, dict]]:
    with path.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            yield line, row


def _jsonl_rows(path: pathlib.Path) -> Iterable[tuple[int, dict]]:
    with path.open() as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{line}: not a JSON object ({exc.msg}): {text.strip()[:80]}") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{line}: expected a JSON object per line, got {text.strip()[:80]}")
            yield line, row


def _parse_row(path: pathlib.Path, line: int, row: dict) -> tuple[float, int, int]:
    lowered = {str(k).strip().lower(): v for k, v in row.items()}

    def pick(keys: Sequence[str], what: str, required: bool) -> object:
        for k in keys:
            if k in lowered and lowered[k] not in (None, ""):
                return lowered[k]
        if required:
            raise ConfigError(f"{path}:{line}: no {what} column; name it one of {list(keys)}")
        return None

    arrival = pick(_ARRIVAL_KEYS, "arrival time", required=False)
    try:
        n_in = int(float(pick(_INPUT_KEYS, "input length", required=True)))
        n_out = int(float(pick(_OUTPUT_KEYS, "output length", required=True)))
        t = 0.0 if arrival is None else _seconds(arrival)
    except ValueError as exc:
        raise ConfigError(f"{path}:{line}: a value is not a number ({exc}); row: {row}") from None
    return t, n_in, n_out


def _seconds(value: object) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        return datetime.datetime.fromisoformat(text).timestamp()  # ValueError when not a date either
