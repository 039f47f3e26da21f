"""The exception hierarchy of torch_tessera.

Every error a user can cause derives from :class:`TesseraError`, so that callers can catch our failures without a bare
``except``. Each message names the problem and, where there is one, the fix.
"""

from __future__ import annotations


class TesseraError(RuntimeError):
    """Base class of every torch_tessera error."""


class ConfigError(TesseraError, ValueError):
    """An option passed to the backend or the CLI is unknown or has a bad value."""


class LoweringError(TesseraError):
    """Inductor could not lower the graph, or its output could not be captured as a kernel program."""


class PTXParseError(TesseraError):
    """PTX text could not be parsed. The message names the kernel, the line number and the line."""


class InfeasiblePlanError(TesseraError):
    """No placement satisfies the constraints (memory budgets, pins). The message names the short device.

    Attributes:
        shortfalls: ``(device, bytes needed, bytes available)`` for each short device, where known (empty when the
            constraint that failed is not a memory budget), so a caller can restate the error in its own terms.
        lower_bound: ``True`` when the bytes needed are only the activation reserve (no device could hold even
            that), so the whole plan needs more: a restated message must say "at least".
    """

    def __init__(self, message: str, shortfalls: tuple[tuple[str, float, float], ...] = (),
                 lower_bound: bool = False) -> None:
        super().__init__(message)
        self.shortfalls = tuple(shortfalls)
        self.lower_bound = lower_bound


class TesseraFallbackWarning(UserWarning):
    """tessera took a slower path, and says why: a graph it could not compile runs with plain Inductor
    (``options={"fallback": "raise"}`` makes that an error; issued once per graph), or a program it could not capture
    as one CUDA graph replays one graph per device segment (issued once per capture)."""


class TesseraCacheWarning(TesseraFallbackWarning):
    """An on-disk cache (``TESSERA_CACHE_DIR``: measured kernel times, plans) cannot be written: the work goes on with
    the results kept in memory for this process, and the next process repeats it."""


class TesseraIdleDeviceWarning(UserWarning):
    """A device named in option ``devices`` with a memory budget (``mem=``) runs no kernel of a graph: the plan uses
    the other devices only. Issued once per graph; raise the budget, or leave the device out, to silence it."""


class TesseraRecompileWarning(UserWarning):
    """A function compiled with tessera was compiled again many times (new shapes): each compile costs seconds, and
    Dynamo gives up after its recompile limit. Pad inputs to a few shapes (``torch_tessera.hf.compile_for_generate``)
    or use a static cache."""


class DeviceUnavailableError(TesseraError):
    """A device string names a device that this machine does not have, or is malformed."""


class GpuNotPresentError(DeviceUnavailableError):
    """A ``cuda:N`` device names a GPU this process does not see.

    Attributes:
        fact: what is missing (``"cuda:0 is not present: this process sees 0 CUDA GPU(s) ..."``).
        fix: the remedy for where the device was asked for (the backend's option, a CLI command, the Python API);
            the message is ``fact`` then ``fix``. :meth:`with_fix` gives the same error with another remedy.
    """

    def __init__(self, fact: str, fix: str = "") -> None:
        super().__init__(f"{fact} {fix}".strip())
        self.fact, self.fix = fact, fix

    def with_fix(self, fix: str) -> "GpuNotPresentError":
        """The same missing GPU with ``fix`` as its remedy (raise it ``from None`` in place of this one)."""
        return GpuNotPresentError(self.fact, fix)


class TransferTimeout(TesseraError):
    """A cross-device transfer did not complete within the timeout. The message names the edge and the devices."""


class UnsupportedModelError(TesseraError, KeyError):
    """A model name is not in the registry. The message lists the registry."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class DeviceOutOfMemoryError(TesseraError):
    """A device ran out of memory while running a plan. The message names the device, the plan's estimate and the
    memory actually in use."""


class PTXCompileError(TesseraError):
    """Triton could not compile a kernel to PTX, or its PTX parameters do not match the kernel's signature."""


class TargetDisagreementError(TesseraError):
    """The access summaries of one kernel compiled for two GPU targets differ (a bug in the analysis or in Triton)."""


class NotApplicableError(TesseraError):
    """A baseline does not apply to this workload (e.g. ``pd`` on a single program). Benchmarks show it as n/a."""


class EngineProtocolError(TesseraError):
    """An engine broke the :class:`Engine` contract (a wrong number of tokens, a negative time, a request decoded
    before its prefill or after its release). The message names the engine call and the request."""


class PeerFailureError(TransferTimeout):
    """In a multi-process run (:mod:`torch_tessera.runtime.distributed`), a peer rank died or stopped answering while
    this rank waited on a transfer with it. The message names this rank, the peer rank, the edge (buffer, byte range,
    producer launch -> consumer launch, devices) and the timeout.

    Attributes:
        rank: the rank that raised.
        peer: the rank that failed to send or receive.
        edge: the DAG edge ``(producer, consumer)`` of a cut transfer, ``None`` for input and gather transfers.
        buffer: the buffer being transferred.
        batch: the micro-batch of a pipelined run (``DistributedExecutor.run_pipelined``), ``None`` for a single call.
    """

    def __init__(self, message: str, *, rank: int, peer: int, edge: tuple[int, int] | None, buffer: str,
                 batch: int | None = None) -> None:
        super().__init__(message)
        self.rank, self.peer, self.edge, self.buffer, self.batch = rank, peer, edge, buffer, batch


class RendezvousError(TesseraError):
    """The processes of a multi-process run could not meet (a rank never started, a wrong address or port), or they
    built different programs or placements. The message names the ranks and the fix."""


class ScheduleError(TesseraError):
    """A pipelined schedule (:class:`torch_tessera.scheduler.pipeline_schedule.PipelinedSchedule`) is refused before
    it runs: a RAW/WAR/WAW edge between launches is not covered by a wait (or, on one device, by the issue order), a
    cut has no transfer, a wait names an event nobody records, or the waits deadlock. The message names the edge,
    the micro-batch and the devices.

    Attributes:
        edge: the DAG edge ``(producer, consumer)`` at fault, ``None`` when the fault is not one edge's.
        micro_batch: the micro-batch at fault, ``None`` when it is not one micro-batch's.
    """

    def __init__(self, message: str, *, edge: tuple[int, int] | None = None, micro_batch: int | None = None) -> None:
        super().__init__(message)
        self.edge, self.micro_batch = edge, micro_batch


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` attributed to the user's code: the first frame outside torch and
    torch_tessera (the line that called the compiled model), so the warning names that line and the default
    ``"once per location"`` filter works on it."""
    import inspect
    import os
    import sys
    import warnings

    import torch

    inside = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, sys.modules[__package__]))
    here = inspect.currentframe()
    frame, level = (here.f_back if here is not None else None), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(inside):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1 if frame is not None else 2)
