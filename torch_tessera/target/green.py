"""Green-context SM partitions of one GPU, and a bandwidth-throttling memory streamer.

A green context (CUDA driver API, CUDA >= 12.4) owns a subset of a GPU's SMs; work launched on a stream created in it
runs only on those SMs. That turns one H200 into a real, weaker device: compute falls with the SM count, bandwidth falls
less. We create it through cuda-python (``cuda.bindings.driver``: ``cuDevSmResourceSplitByCount``,
``cuDevResourceGenerateDesc``, ``cuGreenCtxCreate``, ``cuGreenCtxStreamCreate``) and hand PyTorch the stream with
``torch.cuda.ExternalStream``. cuda-python reports the SM count actually granted; SMs come in hardware groups (on
sm_90 a multiple of 8, at least 8: asking 66 gives 72 on the H200). When cuda-python is missing we fall back to
``torch.cuda.GreenContext`` (torch >= 2.9), which does not report the granted count, so we predict it.

These are process-level objects: nothing here changes the card's settings (clocks, MIG, compute mode).

Checked against cuda-python 13.3 bindings and torch 2.11 / 2.13 (the ``torch.cuda.GreenContext.create`` keywords
``num_sms`` and ``device_id``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_tessera.errors import DeviceUnavailableError

log = logging.getLogger(__name__)

try:  # cuda-python >= 12.6 spells it cuda.bindings.driver; older releases cuda.cuda
    from cuda.bindings import driver as _drv
except ImportError:  # pragma: no cover - depends on the machine
    try:
        from cuda import cuda as _drv  # type: ignore[no-redef]
    except ImportError:
        _drv = None


def sm_granularity(major: int) -> tuple[int, int]:
    """Minimum SM count and SM multiple of one green-context group on compute capability ``major``.

    From the CUDA driver API documentation of ``cuDevSmResourceSplitByCount`` (CUDA 12.4-13.x): 6.x: 1 and 1;
    7.x: 2 and 2; 8.x: 4 and 2; 9.0 and later: 8 and 8.
    """
    if major >= 9:
        return 8, 8
    if major == 8:
        return 4, 2
    if major == 7:
        return 2, 2
    return 1, 1


def predict_granted_sms(requested: int, major: int, total: int) -> int:
    """SMs a green context asking for ``requested`` SMs will get on a GPU of ``total`` SMs.

    Raises:
        DeviceUnavailableError: the request, rounded up to the hardware group, exceeds the GPU.
    """
    if requested <= 0:
        raise DeviceUnavailableError(f"an SM partition needs at least 1 SM, got {requested}")
    low, mult = sm_granularity(major)
    granted = max(low, -(-requested // mult) * mult)
    if granted > total:
        raise DeviceUnavailableError(
            f"{requested} SMs round up to {granted} (groups of {mult} on sm_{major}x), more than the GPU's {total}; "
            f"ask for at most {total // mult * mult}"
        )
    return granted


def cuda_python_available() -> bool:
    """Whether cuda-python's driver bindings with green contexts are importable."""
    return _drv is not None and hasattr(_drv, "cuGreenCtxCreate")


def _check(result: tuple, call: str) -> Any:
    """Unpack a cuda-python ``(CUresult, values...)`` tuple, raising on an error code (``call`` names the call)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, name = _drv.cuGetErrorName(err)
        raise DeviceUnavailableError(
            f"{call} failed: {name.decode() if isinstance(name, bytes) else name} ({int(err)}). "
            "Green contexts need CUDA >= 12.4 drivers and an sm_70+ GPU."
        )
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _stream_handle(cu_stream: Any) -> int:
    try:
        return int(cu_stream)
    except TypeError:
        return int(cu_stream.getPtr())


@dataclass
class GreenPartition:
    """A set of SMs of one GPU, with the streams that run on them.

    Attributes:
        device_index: CUDA ordinal of the GPU.
        requested_sms: SMs asked for.
        granted_sms: SMs the partition has (reported by the driver when ``exact``, else predicted).
        total_sms: SMs of the whole GPU.
        stream: the partition's first stream, usable with ``torch.cuda.stream(...)``.
        backend: ``"cuda-python"`` or ``"torch"``.
        exact: whether ``granted_sms`` was reported by the driver.
    """

    device_index: int
    requested_sms: int
    granted_sms: int
    total_sms: int
    stream: torch.cuda.Stream
    backend: str
    exact: bool
    _handle: Any = field(default=None, repr=False)
    _streams: list = field(default_factory=list, repr=False)

    def new_stream(self, priority: int = 0) -> torch.cuda.Stream:
        """Another stream whose work runs only on this partition's SMs (``priority``: lower is more urgent)."""
        if self.backend == "torch":
            log.warning("torch.cuda.GreenContext gives one stream per partition; reusing it (priority ignored)")
            return self.stream
        cu_stream = _check(_drv.cuGreenCtxStreamCreate(
            self._handle, _drv.CUstream_flags.CU_STREAM_NON_BLOCKING, int(priority)), "cuGreenCtxStreamCreate")
        self._streams.append(cu_stream)
        return torch.cuda.ExternalStream(_stream_handle(cu_stream), device=torch.device("cuda", self.device_index))

    def close(self) -> None:
        """Destroy the green context (after its streams' work is done)."""
        if self.backend == "cuda-python" and self._handle is not None:
            torch.cuda.synchronize(self.device_index)
            for s in self._streams:
                _drv.cuStreamDestroy(s)
            _drv.cuGreenCtxDestroy(self._handle)
            self._handle = None


def _ensure_context(device_index: int) -> None:
    if not torch.cuda.is_available() or device_index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"cuda:{device_index} is not present (this process sees {torch.cuda.device_count() if torch.cuda.is_available() else 0} "
            "CUDA GPUs); use cpu:N or sim:NAME devices on a machine without that GPU"
        )
    torch.empty(1, device=torch.device("cuda", device_index))  # makes torch's primary context current there


_REMAINDER_CONTEXTS: list = []


def _partition_cuda_python(device_index: int, sms: int, reserve_sms: int) -> tuple[GreenPartition, GreenPartition | None]:
    _ensure_context(device_index)
    _check(_drv.cuInit(0), "cuInit")
    dev = _check(_drv.cuDeviceGet(device_index), "cuDeviceGet")
    whole = _check(_drv.cuDeviceGetDevResource(dev, _drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                   "cuDeviceGetDevResource")
    total = int(whole.sm.smCount)
    groups, _, remaining = _check(_drv.cuDevSmResourceSplitByCount(1, whole, 0, sms),
                                    f"cuDevSmResourceSplitByCount({sms} SMs)")
    parts = [(sms, groups[0])]
    if reserve_sms:
        left = int(remaining.sm.smCount)
        if reserve_sms >= left or left - reserve_sms < 8:
            # the rest of the GPU (a split must come in groups of 8 SMs on sm_90, so asking for "all but a few" of
            # the remaining SMs is refused with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
            parts.append((reserve_sms, remaining))
        else:
            # A split's outputs cannot be split again directly (CUDA driver API docs, cuDevSmResourceSplitByCount):
            # make a green context of the remainder first and split the SM resource it reports.
            rdesc = _check(_drv.cuDevResourceGenerateDesc([remaining], 1), "cuDevResourceGenerateDesc(remainder)")
            rctx = _check(_drv.cuGreenCtxCreate(rdesc, dev, _drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
                          "cuGreenCtxCreate(remainder)")
            rres = _check(_drv.cuGreenCtxGetDevResource(rctx, _drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                          "cuGreenCtxGetDevResource(remainder)")
            more, _, _ = _check(_drv.cuDevSmResourceSplitByCount(1, rres, 0, reserve_sms // 8 * 8 or 8),
                                  f"cuDevSmResourceSplitByCount({reserve_sms} streamer SMs)")
            parts.append((reserve_sms, more[0]))
            _REMAINDER_CONTEXTS.append(rctx)  # kept alive while resources split from it are in use
    made = []
    for requested, resource in parts:
        desc = _check(_drv.cuDevResourceGenerateDesc([resource], 1), "cuDevResourceGenerateDesc")
        ctx = _check(_drv.cuGreenCtxCreate(desc, dev, _drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
                     "cuGreenCtxCreate")
        cu_stream = _check(_drv.cuGreenCtxStreamCreate(ctx, _drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0),
                           "cuGreenCtxStreamCreate")
        stream = torch.cuda.ExternalStream(_stream_handle(cu_stream), device=torch.device("cuda", device_index))
        made.append(GreenPartition(device_index, requested, int(resource.sm.smCount), total, stream,
                                   "cuda-python", True, ctx, [cu_stream]))
    return made[0], (made[1] if reserve_sms else None)


def _partition_torch(device_index: int, sms: int, reserve_sms: int) -> tuple[GreenPartition, GreenPartition | None]:
    _ensure_context(device_index)
    props = torch.cuda.get_device_properties(device_index)
    total = props.multi_processor_count
    made = []
    for requested in [sms] + ([reserve_sms] if reserve_sms else []):
        granted = predict_granted_sms(requested, props.major, total)
        gc = torch.cuda.GreenContext.create(num_sms=requested, device_id=device_index)
        made.append(GreenPartition(device_index, requested, granted, total, gc.Stream(), "torch", False, gc))
    if reserve_sms:
        log.warning("torch.cuda.GreenContext cannot make disjoint partitions: the throttling streamer on cuda:%d may "
                    "share SMs with the partition; install cuda-python for disjoint ones", device_index)
    return made[0], (made[1] if reserve_sms else None)


def create_partition(device_index: int, sms: int, reserve_sms: int = 0) -> tuple[GreenPartition, GreenPartition | None]:
    """Restrict work on GPU ``device_index`` to ``sms`` SMs (rounded up to the hardware group).

    Args:
        device_index: CUDA ordinal.
        sms: SMs requested for the partition.
        reserve_sms: if > 0, also carve a second, disjoint partition of that many SMs out of the remaining ones
            (for the bandwidth-throttling streamer).

    Returns:
        The partition and the reserved partition (or ``None``).

    Raises:
        DeviceUnavailableError: no CUDA GPU with that index, neither cuda-python nor ``torch.cuda.GreenContext`` is
            available, or the driver refused (the message names the call).
    """
    if cuda_python_available():
        part, reserve = _partition_cuda_python(device_index, sms, reserve_sms)
    elif getattr(torch.cuda, "GreenContext", None) is not None and torch.cuda.is_available():
        part, reserve = _partition_torch(device_index, sms, reserve_sms)
    else:
        raise DeviceUnavailableError(
            f"cannot restrict cuda:{device_index} to {sms} SMs: green contexts need cuda-python "
            "(pip install cuda-python) or a torch build with torch.cuda.GreenContext, and a CUDA GPU"
        )
    log.info("cuda:%d partition: asked %d SMs, granted %d of %d (%s)", device_index, sms, part.granted_sms,
             part.total_sms, part.backend)
    return part, reserve


class BandwidthStreamer:
    """A memory-streaming kernel that runs on its own SMs and takes DRAM bandwidth from everyone else on the GPU.

    A background thread keeps an elementwise copy (``torch.neg(src, out=dst)``: reads and writes ``nbytes`` each) queued
    on ``stream``, at most ``max_in_flight`` launches ahead, until :meth:`stop`. It slows memory-bound kernels on the
    other SMs more than compute-bound ones (docs/DESIGN.md, green-context partitions).

    Args:
        stream: a stream of a green-context partition holding the streamer's SMs.
        device_index: CUDA ordinal.
        nbytes: size of each of the two buffers, bytes.
        max_in_flight: launches queued ahead of the GPU.
    """

    def __init__(self, stream: torch.cuda.Stream, device_index: int, nbytes: int = 256 << 20, max_in_flight: int = 4):
        self.stream = stream
        self.device_index = device_index
        self.nbytes = nbytes
        self.max_in_flight = max_in_flight
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._launches = 0
        self._seconds = 0.0
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def achieved_bytes_per_s(self) -> float:
        """Bytes read + written per second while it ran (0 before it ran)."""
        return 2 * self.nbytes * self._launches / self._seconds if self._seconds > 0 else 0.0

    def start(self) -> "BandwidthStreamer":
        if self.running:
            return self
        self._stop.clear()
        self._launches = 0
        self._thread = threading.Thread(target=self._loop, name=f"tessera-streamer-cuda{self.device_index}",
                                        daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            with torch.cuda.device(self.device_index), torch.cuda.stream(self.stream):
                n = self.nbytes // 2
                src = torch.ones(n, dtype=torch.bfloat16, device=torch.device("cuda", self.device_index))
                dst = torch.empty_like(src)
                pending: deque = deque()
                t0 = time.perf_counter()
                while not self._stop.is_set():
                    torch.neg(src, out=dst)
                    ev = torch.cuda.Event()
                    ev.record(self.stream)
                    pending.append(ev)
                    self._launches += 1
                    if len(pending) >= self.max_in_flight:
                        pending.popleft().synchronize()
                self.stream.synchronize()
                self._seconds = time.perf_counter() - t0
        except Exception as exc:  # reported by stop(); a thread cannot raise into the caller
            self._error = exc

    def stop(self) -> None:
        """Stop streaming and wait for the queued launches to finish.

        Raises:
            DeviceUnavailableError: the streamer's thread failed (the message carries the cause).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise DeviceUnavailableError(f"bandwidth streamer on cuda:{self.device_index} failed: {err}") from err

    def __enter__(self) -> "BandwidthStreamer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
