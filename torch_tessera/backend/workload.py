"""Build a planning workload for a registry model: its programs lowered without weights, DAGs, costs, topology.

LLM-family models get two programs, as they are served: a prefill of ``prefill_tokens`` for one request and a
decode step of ``decode_batch`` sequences, weighted so that one pipeline *step* is one request's work (one prefill,
``mean_output_tokens / decode_batch`` decode steps). Other models get one program (one forward of a batch).

KV context: for ``llama`` and ``moe`` both programs read and write a static KV cache of ``decode_context`` positions
(:mod:`torch_tessera.static_cache`): the prefill writes its prompt's K/V into a one-sequence cache, the decode step
writes one token per sequence and its attention reads the whole ``decode_batch x decode_context`` cache. The cache
buffers are STATE in both programs under the same names, so each has one owning device per program and the prefill ->
decode hand-over of the prompt's K/V is priced on the link when the owners differ. The default context is the mean
context a decode step sees over a request's life: ``prefill_tokens + mean_output_tokens / 2`` (1024 + 64 = 1088 for
the conversation workload's 1024-token prefill bucket and ~129 output tokens). A static cache's attention covers the
whole cache (masked), so the prefill's attention is priced over ``decode_context`` keys with a mask rather than as
causal attention over ``prefill_tokens`` keys: ~2x the FLOPs of causal attention, as ``transformers``' static cache
does it in ``generate``.

``mamba`` and ``qwen2-vl`` are planned with cacheless forwards (see :mod:`torch_tessera.static_cache` for why); their
decode step lacks the SSM state (a constant, context-independent read) and the KV context respectively. ``qwen2-vl``
is lowered through :func:`torch_tessera.fixed_layout.planning_model`: its prefill with the registry's image layout
fixed (one 504 x 504 image, 324 tokens, per sequence), its decode step text tokens only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from torch_tessera.backend.pipeline import analyze, estimate
from torch_tessera.lowering.cache import cached_program
from torch_tessera.lowering.fake import lower_without_weights
from torch_tessera.target.costs import Topology
from torch_tessera.target.devices import DeviceSpec
from torch_tessera.static_cache import has_kv_cache

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
        from torch_tessera.target.costmodel import estimate_costs
        from torch_tessera.target.links import build_topology

        tables = [estimate_costs(p, list(specs)) for p in self.programs]
        topo = build_topology(list(specs))
        wl = Workload(tuple(replace(wp, costs=t) for wp, t in zip(progs, tables)), tie_state=self.workload.tie_state)
        return replace(self, workload=wl, topology=topo)


def _build_fn(name: str, size: str, batch: int, seq: int):
    def build():
        from torch_tessera.fixed_layout import planning_model

        dtype = torch.bfloat16 if size == "full" else torch.float32
        return planning_model(name, size, batch, seq or None, device="meta", dtype=dtype)

    return build


def _cached_build_fn(name: str, size: str, batch: int, tokens: int, context: int):
    def build():
        from torch_tessera.static_cache import build_static_cache_lm

        dtype = torch.bfloat16 if size == "full" else torch.float32
        return build_static_cache_lm(name, size, batch, tokens, context, device="meta", dtype=dtype)

    return build


def default_decode_context(prefill_tokens: int, mean_output_tokens: float) -> int:
    """Mean KV context of a decode step over a request's life: ``prefill_tokens + round(mean_output_tokens / 2)``."""
    return int(prefill_tokens + round(mean_output_tokens / 2))


#: Sequences per decode step :func:`model_workload` plans an LLM with unless told otherwise.
DECODE_BATCH = 64


def model_workload(
    name: str,
    specs: Sequence[DeviceSpec],
    size: str = "full",
    prefill_tokens: int = 1024,
    decode_batch: int = DECODE_BATCH,
    mean_output_tokens: float = 129.0,
    batch: int | None = None,
    decode_context: int | None = None,
    kv_cache: bool = True,
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
        decode_context: KV cache positions per sequence (tokens) for models with a static cache (``llama``,
            ``moe``); default :func:`default_decode_context`. Must be >= ``prefill_tokens``.
        kv_cache: plan ``llama``/``moe`` with the static KV cache (default); ``False``: the cacheless forwards.

    Raises:
        ValueError: ``decode_context < prefill_tokens``.
        LoweringError: export or Inductor failed on the model.
    """
    from torch_tessera.models import get_model
    from torch_tessera.scheduler import Workload

    t0 = time.perf_counter()
    spec = get_model(name)
    if spec.prefill_decode:
        context = decode_context or default_decode_context(prefill_tokens, mean_output_tokens)
        if context < prefill_tokens:
            raise ValueError(f"decode_context={context} must be >= prefill_tokens={prefill_tokens}")
        if kv_cache and has_kv_cache(name):
            build_prefill = _cached_build_fn(name, size, 1, prefill_tokens, context)
            build_decode = _cached_build_fn(name, size, decode_batch, 1, context)
        else:
            build_prefill = _build_fn(name, size, 1, prefill_tokens)
            build_decode = _build_fn(name, size, decode_batch, 1)
        cached = "static-cache" if kv_cache and has_kv_cache(name) else "cacheless"
        prefill = cached_program(f"{name}/{size}/{cached}/prefill/b1/t{prefill_tokens}/ctx{context}",
                                 lambda: lower_without_weights(build_prefill).program)
        decode = cached_program(f"{name}/{size}/{cached}/decode/b{decode_batch}/t1/ctx{context}",
                                lambda: lower_without_weights(build_decode).program)
        pdag, ddag = analyze(prefill), analyze(decode)
        pcost, topo = estimate(prefill, specs)
        dcost, _ = estimate(decode, specs)
        wl = Workload.llm(pdag, pcost, ddag, dcost, mean_output_tokens / decode_batch)
        out, unit = mean_output_tokens, "tokens"
        programs = (prefill, decode)
    else:
        b = batch or spec.default_shape[size][0]
        program = cached_program(f"{name}/{size}/forward/b{b}",
                                 lambda: lower_without_weights(_build_fn(name, size, b, 0)).program)
        dag = analyze(program)
        cost, topo = estimate(program, specs)
        wl = Workload.single(dag, cost)
        unit = spec.output_unit
        out = spec.outputs_per_forward(b)
        programs = (program,)
    return ModelWorkload(wl, topo, float(out), unit, time.perf_counter() - t0, programs)
