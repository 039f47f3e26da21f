"""Per-policy cost figures for the simulated engine: read from JSON, or a built-in illustrative parameterisation.

JSON format (seconds throughout; ``decode_s_by_bucket`` optional, keyed by bucket size, overriding the line)::

    {
      "source": "where the figures come from",
      "policies": {
        "homo-L":  {"plans": {"main": {"prefill_s_per_token": 2.26e-5, "decode_base_s": 5.1e-3,
                                        "decode_s_per_seq": 8.15e-5}}},
        "tessera": {"plans": {"latency": {...}, "throughput": {...}}}
      }
    }

A policy with one plan runs it throughout; a policy with plans named ``latency`` and ``throughput`` runs under the
plan monitor. The lead's measured per-bucket step times of each plan drop into ``decode_s_by_bucket``.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Mapping

from torch_tessera.errors import ConfigError
from torch_tessera.serving.engine import PlanCost
from torch_tessera.serving.monitor import LATENCY_PLAN, THROUGHPUT_PLAN

_PLAN_FIELDS = ("prefill_s_per_token", "decode_base_s", "decode_s_per_seq", "prefill_overhead_s", "decode_s_by_bucket")

#: Llama-3.1-8B decode-step and prefill figures per decoder layer on one H200, microseconds (CUDA events, median of
#: 30; docs/BENCHMARKS.md, per-kernel-class time of one Llama-3.1-8B decoder layer):
#: (batch 64 ctx 1024 decode, batch 256 ctx 2048 decode, prefill of 4 x 1024 tokens), whole GPU and 72-SM partition.
H200_LAYER_US = {"whole": (179 + 82 + 61, 249 + 505 + 57, 2407 + 102 + 380),
                 "72sm": (199 + 93 + 53, 371 + 514 + 70, 3873 + 156 + 622)}
LLAMA_8B_LAYERS = 32


@dataclass(frozen=True)
class PolicyCosts:
    """The simulated plans of one policy.

    Attributes:
        plans: plan name -> cost figures; either one plan, or ``latency`` and ``throughput``.
    """

    plans: Mapping[str, PlanCost]

    def __post_init__(self) -> None:
        names = set(self.plans)
        if len(names) != 1 and names != {LATENCY_PLAN, THROUGHPUT_PLAN}:
            raise ConfigError(f"a policy has one plan or exactly the plans {LATENCY_PLAN!r} and {THROUGHPUT_PLAN!r}; "
                              f"got {sorted(names)}")

    @property
    def monitored(self) -> bool:
        """Whether the policy switches between a latency and a throughput plan."""
        return len(self.plans) == 2


def load_policy_costs(path: str | pathlib.Path) -> tuple[dict[str, PolicyCosts], str]:
    """Read a cost file; returns (policy name -> costs, the file's ``source`` text)."""
    path = pathlib.Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read simulated cost file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("policies"), dict) or not data["policies"]:
        raise ConfigError(f"{path}: expected an object with a non-empty \"policies\" object (see "
                          "torch_tessera/serving/simcosts.py for the format)")
    policies = {}
    for name, entry in data["policies"].items():
        plans = entry.get("plans") if isinstance(entry, dict) else None
        if not isinstance(plans, dict) or not plans:
            raise ConfigError(f"{path}: policy {name!r} needs a non-empty \"plans\" object")
        policies[name] = PolicyCosts({p: _plan_cost(path, name, p, fig) for p, fig in plans.items()})
    return policies, str(data.get("source", path))


def _plan_cost(path: pathlib.Path, policy: str, plan: str, figures: object) -> PlanCost:
    if not isinstance(figures, dict):
        raise ConfigError(f"{path}: policy {policy!r} plan {plan!r} must be an object of cost figures")
    unknown = sorted(set(figures) - set(_PLAN_FIELDS))
    if unknown:
        raise ConfigError(f"{path}: policy {policy!r} plan {plan!r} has unknown fields {unknown}; "
                          f"valid: {list(_PLAN_FIELDS)}")
    try:
        return PlanCost(**figures)
    except TypeError as exc:
        raise ConfigError(f"{path}: policy {policy!r} plan {plan!r}: {exc}") from None


def _line(layer_us: tuple[int, int, int]) -> PlanCost:
    """Decode step time as a line through the two measured batches (contexts differ; not modelled), and prefill
    seconds per token, for the whole model (layers only: embedding and LM head left out)."""
    b64, b256, prefill = (v * LLAMA_8B_LAYERS * 1e-6 for v in layer_us)
    per_seq = (b256 - b64) / (256 - 64)
    return PlanCost(prefill_s_per_token=prefill / 4096, decode_base_s=b64 - 64 * per_seq, decode_s_per_seq=per_seq)


def default_policy_costs(hop_s: float = 20e-6, hops_per_step: int = 2 * LLAMA_8B_LAYERS) -> dict[str, PolicyCosts]:
    """An illustrative pair: an H200 (L) and a 72-SM partition of one (R), with figures derived from the measured
    per-layer profile (:data:`H200_LAYER_US`). Only ``homo-L`` and ``homo-R`` come from measurements; the tessera
    plans are derived by rule, to exercise the loop and the monitor, and are not predictions:

    * ``tessera`` latency plan: every kernel on L (no hop on a step's critical path), i.e. homo-L's figures;
    * ``tessera`` throughput plan: work split between L and R in proportion to their speeds (per-token and
      per-sequence costs combine as parallel rates), plus ``hops_per_step`` cross-device hops of ``hop_s`` seconds
      on every decode step's critical path (default: two per layer at ~20 us, the measured Python-issued peer copy
      of DESIGN.md).

    ``tessera-latency`` and ``tessera-throughput`` run one of the two plans throughout, for comparison with the
    monitor. Phase- and block-split baselines (pd, af) overlap work on two devices in ways this serial engine does
    not model; give their measured figures in a JSON file.
    """
    left, right = _line(H200_LAYER_US["whole"]), _line(H200_LAYER_US["72sm"])

    def parallel(a: float, b: float) -> float:
        return 1.0 / (1.0 / a + 1.0 / b)

    throughput = PlanCost(prefill_s_per_token=parallel(left.prefill_s_per_token, right.prefill_s_per_token),
                          decode_base_s=max(left.decode_base_s, right.decode_base_s) + hops_per_step * hop_s,
                          decode_s_per_seq=parallel(left.decode_s_per_seq, right.decode_s_per_seq))
    return {
        "homo-L": PolicyCosts({"main": left}),
        "homo-R": PolicyCosts({"main": right}),
        "tessera-latency": PolicyCosts({"main": left}),
        "tessera-throughput": PolicyCosts({"main": throughput}),
        "tessera": PolicyCosts({LATENCY_PLAN: left, THROUGHPUT_PLAN: throughput}),
    }


DEFAULT_SOURCE = ("illustrative: homo-L/homo-R from the measured H200 per-layer profile (docs/DESIGN.md); tessera plans "
                  "derived by rule (see torch_tessera.serving.simcosts.default_policy_costs), not measured")
