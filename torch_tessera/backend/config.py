"""The backend's options, parsed once into a frozen, strict config: every value checked by type and range, an error
listing the valid values (the values themselves live in :mod:`torch_tessera.options`)."""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from typing import Any, Mapping

from torch_tessera.errors import ConfigError, DeviceUnavailableError
from torch_tessera.options import (BACKEND_POLICIES, COSTS, CUDA_GRAPHS, FALLBACKS, GRAPH_COPIES, PRIORITY_CLASSES,
                                   STATIC_INPUTS, check_choice)

#: kept for callers that read the tuples here; the home is :mod:`torch_tessera.options`
POLICIES = BACKEND_POLICIES


@dataclass(frozen=True)
class TesseraConfig:
    """Options of ``torch.compile(..., backend="tessera", options={...})``.

    Attributes:
        fallback: what to do when a graph cannot be lowered: ``"inductor"`` (default) issues one
            :class:`~torch_tessera.errors.TesseraFallbackWarning` naming the reason and compiles the graph with plain
            Inductor; ``"raise"`` re-raises the error.
        dump_dir: when set, every stage writes its artifacts there (``program_<n>.json``, one ``.py`` per kernel,
            each MILP the scheduler solves as ``milp_<n>.mps``, the plan as ``plan_<policy>_<n>.json``).
        devices: devices to run on, e.g. ``("cuda:0", "cuda:0@72sm")``, ``"cpu:0,cpu:1"`` or with a memory
            budget ``"cpu:0,mem=1KB,cpu:1"`` (a ``key=value`` piece belongs to the device before it; see
            :func:`torch_tessera.target.devices.split_devices`). Stored one string per device. The first must hold
            the model's tensors. Empty: run the program on the model's device.
        policy: how launches are placed on ``devices``: ``"throughput"`` (default: the scheduler's pipelined MILP),
            ``"latency"`` (critical path), a baseline (``"homo-L"``, ``"homo-R"``, ``"af"``, ``"layer"``), ``"home"``
            (all on the first device) or ``"random"`` (a random device per launch, seeded by ``seed``: a
            correctness check). Option ``costs`` says where the planned policies take kernel times from.
        seed: seed of the ``"random"`` policy (an int).
        timeout_s: seconds a call waits for its cross-device transfers before raising ``TransferTimeout`` (a
            positive number).
        cuda_graphs: replay CUDA graphs (CUDA devices only). ``None`` (default): ``"whole"`` on GPU devices, off on
            CPU devices; ``False`` turns them off. ``True`` or ``"whole"`` captures the whole placed
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
        costs: where the plan's kernel times come from: ``"auto"`` (default) measures them when ``devices`` names
            real GPUs or green-context partitions (``"cuda:0"``, ``"cuda:0@104sm,cuda:0@24sm"``) and takes the cost
            model otherwise (CPU devices, or ``devices`` unset: one device, nothing to place); ``"model"`` keeps the
            cost model (the calibrated kernel model for catalog GPUs, the roofline otherwise) even on real GPUs;
            ``"measured"`` measures on any devices, CPU ones included (there under Triton's interpreter). Measuring
            times each distinct launch once per device at compile time (identical layers share one timing) and
            caches the times, and the plan, under ``$TESSERA_CACHE_DIR`` (``profiles/``, ``plans/``): a later compile
            of the same model on the same devices, in any process, times nothing and solves nothing.
            :func:`torch_tessera.explain` and the plan's summary name the costs used. Links between the devices are
            modelled either way (``torch_tessera.target.links``). Ignored by ``"home"`` and ``"random"``.
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
    cuda_graphs: bool | str | None = None
    graph_copies: str = "link"
    static_inputs: str = "place"
    priority: str = "normal"
    costs: str = "auto"

    def __post_init__(self) -> None:
        check_choice("fallback", self.fallback, FALLBACKS)
        object.__setattr__(self, "dump_dir", _dump_dir(self.dump_dir))
        object.__setattr__(self, "devices", _devices(self.devices))
        check_choice("policy", self.policy, BACKEND_POLICIES)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"option seed={self.seed!r} must be an int (the seed of policy='random')")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ConfigError(f"option timeout_s={self.timeout_s!r} must be a positive number of seconds, e.g. 60")
        check_choice("cuda_graphs", self.cuda_graphs, CUDA_GRAPHS)
        check_choice("graph_copies", self.graph_copies, GRAPH_COPIES)
        if self.graph_copies != "link" and self.cuda_graphs not in (True, "whole"):
            raise ConfigError(f"option graph_copies={self.graph_copies!r} places copies inside one CUDA graph over the "
                              f"devices: also pass cuda_graphs=True (got cuda_graphs={self.cuda_graphs!r})")
        check_choice("static_inputs", self.static_inputs, STATIC_INPUTS)
        check_choice("priority", self.priority, PRIORITY_CLASSES)
        check_choice("costs", self.costs, COSTS)

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


def _devices(value: Any) -> tuple[str, ...]:
    """One string per device (``"cpu:0,mem=1KB"``) from a comma-separated string or a sequence of strings."""
    from torch_tessera.target.devices import parse_size, repeated_devices, split_devices

    if isinstance(value, str):
        items: list[str] = [value]
    elif isinstance(value, (list, tuple)) and all(isinstance(d, str) for d in value):
        items = list(value)
    else:
        raise ConfigError(f"option devices={value!r} must be a string such as 'cuda:0,cuda:1' or 'cpu:0,mem=1KB,cpu:1'"
                          ", or a list of such strings")
    if not any(d.strip() for d in items):
        return ()
    try:
        groups = tuple(split_devices(items))
    except DeviceUnavailableError as e:
        raise ConfigError(f"option devices={value!r}: {e}") from None
    twice = repeated_devices([g.split(",")[0].strip() for g in groups])
    if twice:
        raise ConfigError(f"option devices={value!r}: {twice} (two partitions of one GPU are "
                          "cuda:0@104sm,cuda:0@24sm)")
    for g in groups:
        for piece in g.split(",")[1:]:
            key, _, size = piece.partition("=")
            if key.strip() == "mem":
                try:
                    parse_size(size.strip())
                except ValueError as e:
                    raise ConfigError(f"option devices={value!r}: {piece.strip()!r} of device {g.split(',')[0]!r}: "
                                      f"{e}") from None
    return groups


def _dump_dir(value: Any) -> str | None:
    """``dump_dir`` as a path string, created now so that a path that cannot be written fails here."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"option dump_dir={value!r} must be a directory path (a string)")
    from torch_tessera.outpaths import check_output_dir

    return check_output_dir(os.fspath(value), "dump_dir")
