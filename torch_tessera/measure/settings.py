"""What the measured bench builds and how its step times become throughput: :class:`MeasureSettings`,
:class:`Composition`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from torch_tessera.errors import ConfigError

#: Registry families the measured bench builds programs for (``measure.programs``), and what each gets.
MEASURED_FAMILIES = {
    "llm": "prefill + decode over a static KV cache",
    "moe": "prefill + decode over a static KV cache",
    "ssm": "prefill + decode over the conv/SSM state",
    "diffusion": "one denoising step",
}
#: Prompt tokens of the prefill program when not given, per (family kind, size). Mamba's prefill runs transformers'
#: torch scan, unrolled per token under Inductor, so its prompt is short (docs/BENCHMARKS.md, "Measured mode").
DEFAULT_PREFILL = {("kv", "full"): 1024, ("kv", "tiny"): 16, ("ssm", "full"): 32, ("ssm", "tiny"): 8}
#: Repeated blocks kept when ``layers`` is not given, per size (``None``: all). Eight keep each full-size model's
#: measured run within ~3 minutes on an H200 pair, compile dominating (docs/BENCHMARKS.md, "Measured mode").
DEFAULT_LAYERS = {"full": 8, "tiny": None}
#: Sequences per decode step when not given, per size.
DEFAULT_DECODE_BATCH = {"full": 64, "tiny": 4}
#: How each output unit is shown: (label, factor from units per second).
UNIT_DISPLAY = {"tokens": ("tok/s", 1.0), "images": ("images/min", 60.0), "rows": ("rows/s", 1.0)}


@dataclass(frozen=True)
class Composition:
    """How measured program times become throughput.

    One workload step runs program ``name`` ``frequencies[name]`` times and yields ``output_per_step`` output units:
    for an LLM or SSM one request (a prefill and ``output_tokens / decode_batch`` decode steps; ``output_tokens``
    tokens), for a diffusion model one denoising step of ``batch`` images (``batch / steps_per_image`` images; the
    registry's :meth:`~torch_tessera.models.ModelSpec.outputs_per_forward`, as the predicted bench counts it). The
    scheduler's :class:`~torch_tessera.scheduler.Workload` is built with the same frequencies.

    Attributes:
        frequencies: program name -> runs per workload step, in the order a step runs them.
        output_per_step: output units per workload step.
        unit: ``"tokens"`` or ``"images"`` (:data:`~torch_tessera.models.OUTPUT_UNITS`).
    """

    frequencies: Mapping[str, float]
    output_per_step: float
    unit: str

    def per_s(self, seconds: Mapping[str, float]) -> float:
        """Output units per second when program ``n`` takes ``seconds[n]`` per call, run one after another."""
        step = sum(f * seconds[n] for n, f in self.frequencies.items())
        return self.output_per_step / step if step > 0 else math.nan

    @property
    def display(self) -> tuple[str, float]:
        """``(label, factor)``: what tables print (``"tok/s"``, ``"images/min"``) and the factor from units/s."""
        return UNIT_DISPLAY[self.unit]


@dataclass(frozen=True)
class MeasureSettings:
    """What :func:`~torch_tessera.measure.measure_plans` builds, runs and how often.

    Attributes:
        model: registry model of a family in :data:`MEASURED_FAMILIES` (``llama``, ``moe``, ``mamba``, ``dit``).
        devices: comma-separated device strings (``"cuda:0,cuda:1@24sm"``, ``"cpu:0,cpu:1"``).
        size: ``"full"`` or ``"tiny"``.
        layers: keep ``layers`` repeated blocks (decoder layers, Mamba blocks: the first ones; ``dit``: the first
            ``layers - 1`` joint blocks and the last one, which differs); ``None``: :data:`DEFAULT_LAYERS` (8 at full
            size, all at tiny size). :attr:`kept_layers` is the resolved value.
        prefill_tokens: prompt tokens of the prefill program (:data:`DEFAULT_PREFILL`); LLMs and SSMs.
        decode_batch: sequences per decode step (:data:`DEFAULT_DECODE_BATCH`); LLMs and SSMs.
        context: KV cache positions per sequence (default ``prefill_tokens + round(output_tokens / 2)``); LLMs.
        output_tokens: mean output tokens per request (conversation workload: 129); LLMs and SSMs.
        repeats: timed calls per plan and program (median kept).
        warmup: untimed calls before timing, after the checked call (which also captures CUDA graphs).
        profile_repeats / profile_warmup: timed / untimed runs per distinct launch when profiling.
        micro_batches: micro-batches for the pipelined timing of multi-device plans (0 or 1: skip it).
        concurrent_steps: workload steps timed with the programs (prefill and decode) running at the same time from
            separate host threads, for plans over several devices of multi-program workloads (0: skip it); on GPUs
            raised until every program makes >= 16 calls (:func:`~torch_tessera.measure.execute.concurrent_counts`).
        links: ``"catalog"`` (modelled links) or ``"measured"`` (timed copies between the devices).
        cuda_graphs: capture CUDA graphs (``None``: when every device is a GPU).
        profile_cache: profile cache directory (``None``: ``$TESSERA_CACHE_DIR`` or ``~/.cache/torch_tessera``).
        streams: one request stream per device (:func:`~torch_tessera.scheduler.plan_streams`) is a candidate of
            tessera's space beside the single placements (:func:`~torch_tessera.measure.execute.make_plans`); ``False``
            leaves it out (``--no-streams``: executed streams plans ran below their model, docs/BENCHMARKS.md,
            request streams).
        priorities: give the most frequent program of a multi-program workload (an LLM's decode) ``"urgent"``
            streams and the others ``"background"`` ones (:func:`~torch_tessera.measure.execute.program_priorities`).
            Off by default: they did not help reliably (docs/BENCHMARKS.md, stream priorities).
    """

    model: str = "llama"
    devices: str = "cpu:0,cpu:1"
    size: str = "tiny"
    layers: int | None = None
    prefill_tokens: int | None = None
    decode_batch: int | None = None
    context: int | None = None
    output_tokens: float = 129.0
    repeats: int = 10
    warmup: int = 2
    profile_repeats: int = 10
    profile_warmup: int = 2
    micro_batches: int = 4
    concurrent_steps: int = 8
    links: str = "catalog"
    cuda_graphs: bool | None = None
    profile_cache: str | None = None
    streams: bool = True
    priorities: bool = False

    def __post_init__(self) -> None:
        from torch_tessera.models import get_model

        if self.size not in ("full", "tiny"):
            raise ConfigError(f"size must be 'full' or 'tiny', got {self.size!r}")
        family = get_model(self.model).family
        if family not in MEASURED_FAMILIES:
            kinds = "; ".join(f"{f}: {what}" for f, what in MEASURED_FAMILIES.items())
            raise ConfigError(f"--measure builds programs for these families ({kinds}); {self.model!r} is {family}: "
                              "use the predicted mode (tessera bench without --measure) for it")
        if self.links not in ("catalog", "measured"):
            raise ConfigError(f"links must be 'catalog' or 'measured', got {self.links!r}")
        if self.repeats < 1 or self.profile_repeats < 1 or self.warmup < 0 or self.profile_warmup < 0:
            raise ConfigError("repeats and profile_repeats must be >= 1, warmup and profile_warmup >= 0")
        if self.layers is not None and self.layers < 1:
            raise ConfigError(f"layers must be >= 1, got {self.layers}")
        if self.output_tokens <= 0:
            raise ConfigError(f"output_tokens must be > 0, got {self.output_tokens}")
        if family == "ssm" and self.prefill_tokens is not None and self.prefill_tokens < 2:
            raise ConfigError(f"prefill_tokens={self.prefill_tokens}: an SSM prefill needs >= 2 tokens (one token "
                              "is a decode step)")

    @property
    def family(self) -> str:
        """The model's registry family (``llm``, ``moe``, ``ssm``, ``diffusion``)."""
        from torch_tessera.models import get_model

        return get_model(self.model).family

    @property
    def kept_layers(self) -> int | None:
        """Repeated blocks the programs keep: ``layers``, else :data:`DEFAULT_LAYERS` of the size (``None``: all)."""
        return self.layers if self.layers is not None else DEFAULT_LAYERS[self.size]

    @property
    def shape(self) -> tuple[int | None, int, int | None]:
        """``(prefill_tokens, batch, context)`` with the defaults filled in: for LLMs and SSMs ``batch`` is the
        decode batch and ``context`` the KV positions (``None`` for an SSM: its state does not grow); for diffusion
        ``(None, images per denoising step, None)`` (the registry's default batch).

        Raises:
            ConfigError: ``context < prefill_tokens``.
        """
        from torch_tessera.models import get_model

        if self.family == "diffusion":
            return None, get_model(self.model).default_shape[self.size][0], None
        kind = "ssm" if self.family == "ssm" else "kv"
        p = self.prefill_tokens or DEFAULT_PREFILL[(kind, self.size)]
        b = self.decode_batch or DEFAULT_DECODE_BATCH[self.size]
        if kind == "ssm":
            return p, b, None
        c = self.context or p + int(round(self.output_tokens / 2))
        if c < p:
            raise ConfigError(f"context={c} must be >= prefill_tokens={p}")
        return p, b, c

    @property
    def composition(self) -> Composition:
        """How this model's program times become throughput (see :class:`Composition`)."""
        from torch_tessera.models import get_model

        _, batch, _ = self.shape
        spec = get_model(self.model)
        if self.family == "diffusion":
            return Composition({"denoise": 1.0}, spec.outputs_per_forward(batch), spec.output_unit)
        return Composition({"prefill": 1.0, "decode": self.output_tokens / batch}, self.output_tokens, "tokens")
