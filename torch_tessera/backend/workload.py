"""Build a planning workload for a registry model: its programs lowered without weights, DAGs, costs, topology.

LLM-family models get two programs, as they are served: a prefill of ``prefill_tokens`` for one request and a
decode step of ``decode_batch`` sequences, weighted so that one pipeline *step* is one request's work (one prefill,
``mean_output_tokens / decode_batch`` decode steps). Other models get one program (one forward of a batch).

Known gap: the decode step is a forward of one token per sequence *without* a KV cache context (the attention over the
cached context is not in the program), so decode attention is under-represented; planning with the static-cache
decode graph is future work.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from torch_tessera.backend.pipeline import analyze, estimate
from torch_tessera.lowering.fake import lower_without_weights
from torch_tessera.runtime.costs import Topology
from torch_tessera.runtime.devices import DeviceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelWorkload:
    """A model's planning inputs.

    Attributes:
        workload: the scheduler's :class:`~torch_tessera.scheduler.Workload` (programs, DAGs, costs, frequencies).
        topology: devices and links.
        output_per_step: output units (tokens, images) one pipeline step produces.
        unit: ``"tokens"``, ``"images"`` or ``"rows"``.
        seconds: wall time spent lowering, analysing and costing.
        programs: the lowered programs, in the workload's order (to cost them again on other devices).
    """

    workload: object
    topology: Topology
    output_per_step: float
    unit: str
    seconds: float
    programs: tuple = ()

    def on_devices(self, specs: Sequence[DeviceSpec]) -> "ModelWorkload":
        """The same programs costed on other devices (no lowering again)."""
        from dataclasses import replace

        from torch_tessera.scheduler import Workload

        progs = self.workload.programs
        from torch_tessera.runtime.costmodel import estimate_costs
        from torch_tessera.runtime.links import build_topology

        tables = [estimate_costs(p, list(specs)) for p in self.programs]
        topo = build_topology(list(specs))
        wl = Workload(tuple(replace(wp, costs=t) for wp, t in zip(progs, tables)), tie_state=self.workload.tie_state)
        return replace(self, workload=wl, topology=topo)


def _build_fn(name: str, size: str, batch: int, seq: int):
    def build():
        from torch_tessera.models import build_module, get_model

        spec = get_model(name)
        module = build_module(name, size, device="meta", dtype=torch.bfloat16 if size == "full" else torch.float32)
        return module, spec.example_inputs(size, batch, seq or None, device="meta")

    return build


def model_workload(
    name: str,
    specs: Sequence[DeviceSpec],
    size: str = "full",
    prefill_tokens: int = 1024,
    decode_batch: int = 64,
    mean_output_tokens: float = 129.0,
    batch: int | None = None,
) -> ModelWorkload:
    """Lower ``name`` without weights, analyse and cost its program(s) on ``specs``.

    Args:
        name: registry model.
        specs: devices (simulated or real specs; only their figures are used).
        size: ``"full"`` or ``"tiny"``.
        prefill_tokens: prompt length of the prefill program (the paper's trace has a median of ~1020).
        decode_batch: sequences per decode step.
        mean_output_tokens: output tokens per request (median ~129 in the paper's trace).
        batch: batch of the single forward for non-LLM models (default: the registry's).
    """
    from torch_tessera.models import get_model
    from torch_tessera.scheduler import Workload

    t0 = time.perf_counter()
    spec = get_model(name)
    if spec.prefill_decode:
        prefill = lower_without_weights(_build_fn(name, size, 1, prefill_tokens)).program
        decode = lower_without_weights(_build_fn(name, size, decode_batch, 1)).program
        pdag, ddag = analyze(prefill), analyze(decode)
        pcost, topo = estimate(prefill, specs)
        dcost, _ = estimate(decode, specs)
        wl = Workload.llm(pdag, pcost, ddag, dcost, mean_output_tokens / decode_batch)
        out, unit = mean_output_tokens, "tokens"
        programs = (prefill, decode)
    else:
        b = batch or spec.default_shape[size][0]
        program = lower_without_weights(_build_fn(name, size, b, 0)).program
        dag = analyze(program)
        cost, topo = estimate(program, specs)
        wl = Workload.single(dag, cost)
        unit = spec.output_unit
        out = b / spec.forwards_per_output
        programs = (program,)
    return ModelWorkload(wl, topo, float(out), unit, time.perf_counter() - t0, programs)
