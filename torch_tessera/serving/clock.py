"""Clocks for the serving loop: a simulated one (time moves by the engine's reported step times) and the wall clock.

The loop reads ``now()``, calls ``advance(seconds)`` after each engine call with the seconds the engine reported, and
``wait_until(t)`` when idle until the next arrival. On the simulated clock ``advance`` moves time; on the wall clock
time has already passed while the engine ran, so ``advance`` does nothing and ``wait_until`` sleeps.
"""

from __future__ import annotations

import time
from typing import Protocol

from torch_tessera.errors import ConfigError


class Clock(Protocol):
    """Seconds since the start of a run."""

    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...

    def wait_until(self, t: float) -> None: ...


class SimClock:
    """A simulated clock starting at ``start_s`` seconds."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ConfigError(f"SimClock.advance({seconds}): an engine step must take >= 0 seconds")
        self._now += seconds

    def wait_until(self, t: float) -> None:
        self._now = max(self._now, t)


class WallClock:
    """The wall clock (``time.perf_counter``), zero at construction."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def advance(self, seconds: float) -> None:
        """Nothing to do: the engine's step already took its time."""

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)
