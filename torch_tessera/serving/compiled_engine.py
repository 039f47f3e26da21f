"""HOOK: the real engine — a model compiled with the tessera backend under each policy's plans.

``tessera serve-bench --engine real`` calls :func:`make_compiled_engine` once per policy. It is not wired yet; the
lead implements it on top of the backend and the runtime. What it must return is an object with the four methods of
:class:`~torch_tessera.serving.engine.Engine`:

* ``prefill(batch)``: build prompt token ids for each request of ``batch`` (deterministic from the request id, e.g.
  ``torch.Generator().manual_seed(id)``, ``batch.input_tokens[i]`` tokens), run the compiled prefill for bucket
  ``batch.bucket`` under plan ``batch.plan`` (padding rows ``batch.size..bucket-1``), write each request's KV into its
  cache slot, return the greedy first tokens and the measured seconds (CUDA events or a synchronised
  ``time.perf_counter`` around the step);
* ``decode(batch)``: one decode step of ``batch.last_tokens`` at ``batch.positions`` for bucket ``batch.bucket``
  (replaying that bucket's CUDA graph of plan ``batch.plan``), returning the next tokens and the seconds;
* ``switch_plan(plan)``: make the other pre-built plan current, moving live KV caches if the two plans keep them on
  different devices, and return the seconds it took (this is the switch cost the monitor's results charge);
* ``release(ids)``: free the finished requests' cache slots.

Tokens must not depend on the plan (a correct plan computes what eager computes), so a run with switches gives the
same tokens as a run without; ``tests/serving`` checks the loop's half of that promise with the simulated engine.
Serve a real engine on :class:`~torch_tessera.serving.clock.WallClock`.
"""

from __future__ import annotations

from typing import Sequence

from torch_tessera.errors import ConfigError
from torch_tessera.serving.engine import Engine


def make_compiled_engine(model: str, devices: Sequence[str], policy: str, buckets: Sequence[int]) -> Engine:
    """Build the real engine of ``policy`` for ``model`` on ``devices`` (see the module docstring).

    Args:
        model: model name in :mod:`torch_tessera.models`.
        devices: device strings, e.g. ``("cuda:0", "cuda:1@72sm")``.
        policy: ``"homo-L"``, ``"pd"``, ``"af"``, ``"tessera"``...; ``"tessera"`` prepares a ``"latency"`` and a
            ``"throughput"`` plan, the others one plan named ``"main"``.
        buckets: the batch sizes to capture, ascending.

    Raises:
        ConfigError: always, until the real engine is wired.
    """
    raise ConfigError(f"--engine real is not wired yet (policy {policy!r}, model {model!r}): implement "
                      "torch_tessera.serving.compiled_engine.make_compiled_engine; use --engine sim meanwhile")


def plans_of(policy: str) -> tuple[str, ...]:
    """Plan names a real engine prepares for ``policy``: the monitored ``tessera`` has two, the baselines one."""
    return ("latency", "throughput") if policy == "tessera" else ("main",)
