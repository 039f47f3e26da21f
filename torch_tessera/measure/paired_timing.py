"""Interleaved timing and the figures the GPU checks derive from it (pure logic: no CUDA here, tested on CPU).

Timing two things one after the other lets the machine's drift (clocks, another process, the allocator's state) land
on one of them (docs/BENCHMARKS.md, home plan against reduce-overhead). :func:`interleaved_rounds` times every candidate once per *round*, a few calls each, in an order
that alternates between rounds (A B C, C B A, A B C...), so drift hits all of them alike; the figures compare
candidates *within* a round (paired ratios and differences) and report the median and the spread over rounds.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence


def interleaved_rounds(fns: Mapping[str, Callable[[], Any]], rounds: int, calls: int,
                       time_call: Callable[[Callable[[], Any]], float]) -> dict[str, list[float]]:
    """Per round, the median time of ``calls`` calls of each function; the order reverses every other round.

    Args:
        fns: name -> the call to time (already warmed up).
        rounds: rounds (>= 1).
        calls: timed calls per function per round (>= 1).
        time_call: seconds of one call (e.g. ``fn(); torch.cuda.synchronize()`` between two clock reads).

    Returns:
        name -> ``rounds`` per-round medians, seconds.
    """
    if rounds < 1 or calls < 1:
        raise ValueError(f"rounds and calls must be >= 1, got {rounds} and {calls}")
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(statistics.median(time_call(fns[name]) for _ in range(calls)))
    return out


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of a non-empty sequence (numpy's default method)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(xs: Sequence[float], scale: float = 1.0) -> dict:
    """Median, quartiles, extremes and count of ``xs`` (each times ``scale``); ``{"n": 0}`` when empty."""
    if not xs:
        return {"n": 0}
    v = [x * scale for x in xs]
    return {"median": statistics.median(v), "p25": _quantile(v, 0.25), "p75": _quantile(v, 0.75), "min": min(v),
            "max": max(v), "n": len(v)}


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[r] / b[r]`` per round (same rounds, so drift between rounds cancels)."""
    if len(a) != len(b):
        raise ValueError(f"paired rounds differ in number: {len(a)} and {len(b)}")
    return [x / y for x, y in zip(a, b)]


def per_cut_us(placed: Sequence[float], home: Sequence[float], cuts: int, compute_s: float = 0.0) -> list[float]:
    """Microseconds per cut edge in each round: ``(placed - home - compute_s) / cuts``.

    Args:
        placed / home: per-round seconds of the placement and of everything on the home device (same rounds).
        cuts: cut edges of the placement (> 0).
        compute_s: seconds the placement's kernels take more than on the home device (0 when both devices are the
            same kind of whole GPU; see :func:`compute_difference_s`).
    """
    if cuts <= 0:
        raise ValueError(f"cuts must be > 0, got {cuts}")
    return [(p - h - compute_s) * 1e6 / cuts for p, h in zip(placed, home, strict=True)]


def compute_difference_s(costs: Sequence[Sequence[float]], placement: Mapping[int, int], home: int = 0) -> float:
    """Seconds a placement's kernels take beyond running all of them on ``home``, from per-launch costs.

    Args:
        costs: ``costs[d][k]`` = seconds of launch ``k`` on device ``d`` (launches in program order, ``k`` = the
            placement's keys).
        placement: launch -> device.
        home: the device the reference runs everything on.
    """
    return float(sum(costs[d][k] - costs[home][k] for k, d in placement.items() if d != home))


def judge_ratio(ratios: Sequence[float], target: float = 0.03) -> str:
    """``"met"`` when even the upper quartile of the paired ratios is within ``1 + target``, ``"MISSED"`` when even
    the lower quartile is above it, else ``"undecided"`` (the spread straddles the target)."""
    if not ratios:
        return "no data"
    s = spread(ratios)
    if s["p75"] <= 1.0 + target:
        return "met"
    if s["p25"] > 1.0 + target:
        return "MISSED"
    return "undecided"


def whole_identical(specs: Sequence[Any]) -> tuple[bool, str]:
    """Whether every device is a whole GPU of one model and SM count (no partition, throttle or memory budget), so
    that a kernel costs the same wherever it is placed and a placement's extra time is the cost of its hops.

    Args:
        specs: :class:`~torch_tessera.target.devices.DeviceSpec`-like objects (``name``, ``is_gpu``, ``model``,
            ``sm_count``, ``total_sms``, ``requested_sms``, ``throttle_sms``, ``memory_budget``).

    Returns:
        ``(identical, reason)``; the reason names the first device that differs.
    """
    if len(specs) < 2:
        return False, "fewer than two devices"
    first = specs[0]
    for s in specs:
        if not getattr(s, "is_gpu", False):
            return False, f"{s.name} is not a GPU"
        if s.requested_sms is not None or s.sm_count != s.total_sms:
            return False, f"{s.name} is an SM partition ({s.sm_count} of {s.total_sms} SMs)"
        if getattr(s, "throttle_sms", 0) or getattr(s, "memory_budget", None) is not None:
            return False, f"{s.name} is throttled or has a memory budget"
        if (s.model, s.sm_count) != (first.model, first.sm_count):
            return False, f"{s.name} ({s.model}, {s.sm_count} SMs) differs from {first.name}"
    return True, f"{len(specs)} whole {first.model} GPUs ({first.sm_count} SMs each)"
