"""The one home of option values and placement policies: the backend's config, the scheduler, the runtime, the
benchmarks and the CLI all read these tuples from here (imports only :mod:`torch_tessera.errors`, so every package
may import it).

Policies have three audiences:

* :data:`SOLVED_POLICIES` are solved by the scheduler's MILPs (``"throughput"``, ``"latency"``).
* :data:`BASELINES` are the field's placements, built by :mod:`torch_tessera.scheduler.baselines`; ``"homo-<i>"``
  stands for ``"homo-0"``, ``"homo-1"``... (``"homo-L"``/``"homo-R"`` on a pair).
* :data:`BACKEND_POLICIES` are what ``options={"policy": ...}`` accepts: the solved policies, the baselines that
  apply to one program, and two of the backend's own (``"home"``: everything on the first device; ``"random"``: a
  seeded random device per launch, a correctness check).
"""

from __future__ import annotations

import difflib
from typing import Sequence

from torch_tessera.errors import ConfigError

#: What a graph tessera cannot lower does: ``"inductor"`` (warn, run plain Inductor) or ``"raise"``.
FALLBACKS = ("inductor", "raise")
#: Policies the scheduler solves (MILP): pipelined cycle time, one request's critical path.
SOLVED_POLICIES = ("throughput", "latency")
#: Baselines the scheduler builds (``"homo-<i>"`` is a pattern, see :func:`is_policy`).
BASELINES = ("homo-<i>", "homo-L", "homo-R", "request-dist", "pd", "af", "layer")
#: Every policy :func:`torch_tessera.scheduler.plan` accepts.
SCHEDULER_POLICIES = SOLVED_POLICIES + BASELINES
#: Policies of ``options={"policy": ...}`` (one program: ``request-dist`` and ``pd`` need a workload of several).
BACKEND_POLICIES = ("throughput", "latency", "homo-L", "homo-R", "af", "layer", "home", "random")
#: Plans the benchmarks compare on a pair, in display order (``tessera`` is the throughput policy).
BENCH_PLANS = ("homo-L", "homo-R", "request-dist", "pd", "af", "layer", "tessera")
#: Values of ``cuda_graphs``: ``None`` (default: on for GPU devices, off on CPU), off, whole program, segments.
CUDA_GRAPHS = (None, False, True, "whole", "segments")
#: Where each cross-device copy inside one CUDA graph runs (``torch_tessera.runtime.placed``).
GRAPH_COPIES = ("link", "producer", "push")
#: How static inputs reach the devices that read them (``torch_tessera.runtime.schedule``).
STATIC_INPUTS = ("place", "copy")
#: Where the plan's kernel costs come from: ``"auto"`` (measured when option ``devices`` names real GPUs, the cost
#: model otherwise), ``"model"`` (the cost model always), ``"measured"`` (measured on the devices, CPU ones included).
COSTS = ("auto", "model", "measured")
#: Stream priority classes of a compiled program (``torch_tessera.runtime.pipelining``).
PRIORITY_CLASSES = ("normal", "urgent", "background")


def homo_names(num_devices: int) -> list[str]:
    """The ``homo-*`` baseline names for ``num_devices`` devices (``homo-L``/``homo-R`` on a pair)."""
    return ["homo-L", "homo-R"] if num_devices == 2 else [f"homo-{i}" for i in range(num_devices)]


def check_choice(option: str, value: object, choices: Sequence[object]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``; the message lists them and the closest.

    Args:
        option: the option's name as the user wrote it (``"policy"``, ``"--policy"``).
        value: the value given.
        choices: the valid values.
    """
    if any(value is c or (type(value) is type(c) and value == c) for c in choices):
        return
    hint = ""
    if isinstance(value, str):
        close = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"option {option}={value!r} is not one of {tuple(choices)!r}.{hint}")
