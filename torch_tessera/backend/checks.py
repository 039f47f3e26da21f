"""Checks the backend makes before and after planning, each with a message in the user's terms.

* :func:`check_compilable`: tessera compiles inference graphs with static shapes; anything else is a
  :class:`~torch_tessera.errors.LoweringError` raised before Inductor runs (so the Inductor fallback starts from a
  clean state: a half-lowered graph with unbacked symbols would make plain Inductor fail too).
* :func:`in_user_terms`: a plan that does not fit memory, restated with the option that set each budget.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from torch_tessera.errors import InfeasiblePlanError, LoweringError


class InferenceOnlyError(LoweringError):
    """The graph needs a backward pass: tessera compiles inference only."""


class DynamicShapeError(LoweringError):
    """The graph has symbolic or data-dependent shapes: tessera compiles one program per static shape."""


def check_compilable(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Raise unless tessera can compile the graph: inference only, static shapes.

    Raises:
        InferenceOnlyError: grad mode is on and an input (a parameter, usually) requires grad.
        DynamicShapeError: an input size is symbolic, or an op's output shape depends on data.
    """
    from torch_tessera.compat.dynamo import dynamic_shape_reason, needs_autograd

    if needs_autograd(example_inputs):
        raise InferenceOnlyError(
            "tessera is inference-only and this graph needs a backward (grad mode is on and inputs or parameters "
            "require grad). Run the model under torch.no_grad() or torch.inference_mode() (or call "
            "requires_grad_(False) on its parameters); to train, compile with another backend (backend='inductor')")
    reason = dynamic_shape_reason(gm, example_inputs)
    if reason is not None:
        raise DynamicShapeError(
            f"tessera compiles one program per static shape, and {reason}. Pad inputs to a few shapes "
            "(torch_tessera.hf.compile_for_generate does it for generate)")


def in_user_terms(error: InfeasiblePlanError, specs: Sequence[Any], config: Any) -> InfeasiblePlanError:
    """``error`` restated for a user of ``torch.compile``: per short device the bytes needed and available and what
    set the budget (``mem=`` in option ``devices``, or the device's capacity; for a GPU whose partitions share its
    memory, the GPU's memory less its other partitions' ``mem=``), and the options that fix it.

    Args:
        error: what the scheduler raised (its ``shortfalls`` name devices by their spec names).
        specs: the devices' specs, in the order of option ``devices``.
        config: the backend's :class:`~torch_tessera.backend.config.TesseraConfig`.
    """
    from torch_tessera.target.devices import format_bytes

    if not error.shortfalls:
        return InfeasiblePlanError(f"policy={config.policy!r} found no placement: {error}", error.shortfalls,
                                   error.lower_bound)
    by_name = {s.name: s for s in specs}
    parts = []
    for device, needed, have in error.shortfalls:
        spec = by_name.get(device)
        if spec is None:  # a GPU whose partitions share its memory (scheduler: memory pools)
            shared = [s.name for s in specs if s.is_gpu and s.memory_budget is None and f"cuda:{s.index}" == device]
            parts.append(f"GPU {device} needs {format_bytes(needed)} for its partitions {', '.join(shared)} "
                         f"together, has {format_bytes(have, needed)} (its memory, less any mem= budgets of its "
                         f"other partitions in option devices={','.join(config.devices)!r})")
            continue
        if spec.memory_budget is not None:
            what = f"its budget, set by mem= in option devices={','.join(config.devices)!r}"
        else:
            what = "its memory"
        needs = (f"needs at least {format_bytes(needed)} for activations alone (the weights and buffers come on "
                 "top)" if error.lower_bound else f"needs {format_bytes(needed)}")
        parts.append(f"device {device} {needs}, has {format_bytes(have, needed)} ({what})")
    spread = ("" if config.policy == "throughput"
              else ", or use a policy that spreads the weights (policy='throughput')")
    return InfeasiblePlanError(
        f"the model does not fit the devices under policy={config.policy!r}: " + "; ".join(parts)
        + ". Fix: raise or drop mem= in option devices, or add a device to option devices" + spread,
        error.shortfalls, error.lower_bound)


def warn_idle_budgeted(placement: Mapping[int, int], specs: Sequence[Any], config: Any) -> list[str]:
    """Warn (:class:`~torch_tessera.errors.TesseraIdleDeviceWarning`, once per call) for each device of option
    ``devices`` that has a ``mem=`` budget and runs no launch of ``placement`` (launch index -> device index).

    A plan may leave a device idle by choice (it is slower); a user who set a budget on it likely meant it to hold
    part of the model, so that case is said where a person sees it. Returns the messages (empty: nothing said).
    """
    import warnings

    from torch_tessera.errors import TesseraIdleDeviceWarning
    from torch_tessera.target.devices import format_bytes

    if len(specs) < 2:
        return []
    used = set(placement.values())
    said = []
    for i, spec in enumerate(specs):
        if i in used or spec.memory_budget is None:
            continue
        msg = (f"device {config.devices[i].split(',')[0]} (option devices={','.join(config.devices)!r}) runs no "
               f"kernel of this graph: the plan keeps all {len(placement)} launches on the other devices. Its "
               f"memory budget, {format_bytes(spec.memory_budget)} set by mem=, is what it may hold; if it was "
               "meant to run part of the model, raise the budget")
        warnings.warn(msg, TesseraIdleDeviceWarning, stacklevel=2)
        said.append(msg)
    return said
