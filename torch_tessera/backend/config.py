"""The backend's options, parsed once into a frozen, strict config."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Mapping

from torch_tessera.errors import ConfigError

FALLBACKS = ("inductor", "raise")
#: Keep in sync with torch_tessera.backend.pipeline.BACKEND_POLICIES (not imported here: config stays light).
#: Keep in sync with torch_tessera.runtime.placed.GRAPH_COPIES.
GRAPH_COPIES = ("link", "producer", "push")
#: Keep in sync with torch_tessera.runtime.schedule.STATIC_INPUTS.
STATIC_INPUTS = ("place", "copy")
#: stream priority classes (same as torch_tessera.runtime.pipelining.PRIORITY_CLASSES; config stays import-light)
PRIORITY_CLASSES = ("normal", "urgent", "background")
POLICIES = ("throughput", "latency", "homo-L", "homo-R", "af", "layer", "home", "random")


@dataclass(frozen=True)
class TesseraConfig:
    """Options of ``torch.compile(..., backend="tessera", options={...})``.

    Attributes:
        fallback: what to do when a graph cannot be lowered: ``"inductor"`` (default) logs one warning on the
            ``torch_tessera`` logger and compiles the graph with plain Inductor; ``"raise"`` re-raises the error.
        dump_dir: when set, every stage writes its artifacts there (``program_<n>.json``, one ``.py`` per kernel,
            each MILP the scheduler solves as ``milp_<n>.mps``, the plan as ``plan_<policy>_<n>.json``).
        devices: devices to run on, e.g. ``("cuda:0", "cuda:0@72sm")`` or ``"cpu:0,cpu:1"`` (see
            :func:`torch_tessera.target.devices.parse_device`). The first must hold the model's tensors. Empty: run
            the program on the model's device with the single-device executor.
        policy: how launches are placed on ``devices``: ``"throughput"`` (default: the scheduler's pipelined MILP),
            ``"latency"`` (critical path), a baseline (``"homo-L"``, ``"homo-R"``, ``"af"``, ``"layer"``), ``"home"``
            (all on the first device) or ``"random"`` (a random device per launch, seeded by ``seed``: a
            correctness check). Kernel costs come from the roofline cost model of the devices' specs.
        seed: seed of the ``"random"`` policy.
        timeout_s: seconds a call waits for its cross-device transfers before raising ``TransferTimeout``.
        cuda_graphs: replay CUDA graphs (CUDA devices only): ``True`` or ``"whole"`` captures the whole placed
            program as one graph spanning the devices (copies inside it; one graph per segment where CUDA refuses),
            ``"segments"`` one graph per device's run of launches with the copies between them issued from Python.
            On its own (no ``devices``) it runs the whole program as graphs on the model's GPU.
        graph_copies: where each cross-device copy inside one graph over the devices runs: ``"link"`` (default) on
            the link's own copy stream, ordered by events after its producer and before its consumer; ``"producer"``
            on the producing device's stream (no copy stream, one event fewer per hop; compare the two with
            ``bench/gpu_hop_variants.py``); ``"push"``: each cut-edge copy of at most 16 MiB between two GPUs with
            peer access as a copy kernel on the producing GPU writing the consumer's memory (5.0-5.6 us per hop
            against 9.9-10.8 us for ``"link"`` at 8-256 KiB on two H200s), the others as with ``"link"``; on other
            devices every copy as with ``"link"`` (``torch_tessera.runtime.push``). Needs ``cuda_graphs`` ``True``
            or ``"whole"``.
        static_inputs: how module buffers Dynamo passes at one address every call (``KernelProgram.static_inputs``,
            e.g. the MMDiT's 453 MB ``pos_embed``) reach the other devices that read them: ``"place"`` (default)
            copies them there once, like weights, and again before a call whose tensor has another ``data_ptr()``
            or ``_version``, so a caller that changes one in place must use ordinary tensor ops (which bump
            ``_version``); ``"copy"`` copies them every call, needed when they are written through ``.data``,
            numpy or DLPack aliases or custom kernels (see ``torch_tessera.runtime.placed.PlacedExecutor``).
        priority: stream priority class of the compiled program when several share the devices (``"normal"``
            default; ``"urgent"`` for the per-token program, e.g. an LLM's decode, ``"background"`` for bulk work
            such as its prefill): see ``torch_tessera.runtime.pipelining.PRIORITY_CLASSES``.
    """

    fallback: str = "inductor"
    dump_dir: str | None = None
    devices: tuple[str, ...] = ()
    policy: str = "throughput"
    seed: int = 0
    timeout_s: float = 60.0
    cuda_graphs: bool | str = False
    graph_copies: str = "link"
    static_inputs: str = "place"
    priority: str = "normal"

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ConfigError(f"option fallback={self.fallback!r} is not one of {FALLBACKS}")
        if isinstance(self.devices, str):
            object.__setattr__(self, "devices", tuple(d.strip() for d in self.devices.split(",") if d.strip()))
        else:
            object.__setattr__(self, "devices", tuple(self.devices))
        if self.policy not in POLICIES:
            raise ConfigError(f"option policy={self.policy!r} is not one of {POLICIES}")
        if self.cuda_graphs not in (False, True, "whole", "segments"):
            raise ConfigError(f"option cuda_graphs={self.cuda_graphs!r} is not one of False, True, 'whole', 'segments'")
        if self.graph_copies not in GRAPH_COPIES:
            raise ConfigError(f"option graph_copies={self.graph_copies!r} is not one of {GRAPH_COPIES}")
        if self.graph_copies != "link" and self.cuda_graphs not in (True, "whole"):
            raise ConfigError(f"option graph_copies={self.graph_copies!r} places copies inside one CUDA graph over the "
                              f"devices: also pass cuda_graphs=True (got cuda_graphs={self.cuda_graphs!r})")
        if self.static_inputs not in STATIC_INPUTS:
            raise ConfigError(f"option static_inputs={self.static_inputs!r} is not one of {STATIC_INPUTS}")
        if self.priority not in PRIORITY_CLASSES:
            raise ConfigError(f"option priority={self.priority!r} is not one of {PRIORITY_CLASSES}")
        if self.timeout_s <= 0:
            raise ConfigError(f"option timeout_s={self.timeout_s} must be positive (seconds)")

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None, mode: str | None = None) -> "TesseraConfig":
        """Parse ``torch.compile`` options. Unknown keys raise :class:`ConfigError` listing the valid ones.

        Args:
            options: the ``options`` dict given to ``torch.compile``, or None.
            mode: the ``mode`` given to ``torch.compile``; only ``None`` and ``"default"`` are accepted for now.
        """
        if mode not in (None, "default"):
            raise ConfigError(f"mode={mode!r} is not supported by the tessera backend; leave mode unset")
        options = dict(options or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        for key in options:
            if key not in valid:
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown tessera option {key!r}.{hint} Valid options: {', '.join(valid)}")
        return cls(**options)
