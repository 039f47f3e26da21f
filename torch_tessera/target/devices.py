"""Devices: what a user types (``cuda:1@24sm``), what it means in explicit units (:class:`DeviceSpec`), and the runtime
object the executor launches on (:class:`Device`).

Device strings (case-insensitive)::

    cuda:N                   the whole CUDA GPU N
    cuda:N@Ksm               GPU N restricted to K SMs by a green context (granted in hardware groups: on sm_90 a
                             multiple of 8, so 66 -> 72)
    cuda:N@Ksm+throttleT     the same, plus a memory-streaming kernel on T other SMs of GPU N that takes bandwidth
    cuda:N@PROFILE           a named emulation profile (see EMULATION_PROFILES): a100-like, l40s-like, ...
    cpu:N                    CPU virtual device N: its own buffer pool, Triton kernels run in the interpreter
    sim:NAME                 a simulated GPU from the datasheet catalog: a100, l40s, h100, h200, b200, ...
    sim:NAME@Ksm[+throttleT] a simulated partition of a catalog GPU (figures from the partition model)
    ...,mem=SIZE             a memory budget for any of the above: 40GB (1e9 bytes), 40GiB (2**30), 512MB, 123456

Several devices are separated by commas; a ``key=value`` piece belongs to the device before it:
``cuda:0,cuda:1@72sm+throttle36,mem=40GB``.

Figures of a partition come from a model, not a datasheet: peak FLOP/s scale with the SM share (measured on the H200:
16/32/72 SMs gave 110/218/481 of 810 TFLOP/s, i.e. linear); bandwidth saturates, ``B * (1 - exp(-n / (0.33 N))) /
(1 - exp(-1 / 0.33))`` (the same measurement: 0.28/0.52/0.88 of 4250 GB/s, the model says 0.32/0.55/0.85); a
throttling streamer of T SMs takes its demand share ``d(T) / (d(K) + d(T))`` once the two ask for more than ``B``. The
profiler measures the truth; these figures only seed the cost model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Sequence

import torch

from torch_tessera.errors import DeviceUnavailableError, GpuNotPresentError
from torch_tessera.target import catalog, green, prices

log = logging.getLogger(__name__)

ACCEPTED_FORMS = """accepted device strings:
  cuda:N                    whole CUDA GPU N
  cuda:N@Ksm                GPU N restricted to K SMs (green context; granted in hardware groups)
  cuda:N@Ksm+throttleT      ... plus a bandwidth-throttling streamer on T other SMs of GPU N
  cuda:N@PROFILE            emulation profile: {profiles}
  cpu:N                     CPU virtual device N
  sim:NAME                  catalog GPU: {sims}
  sim:NAME@Ksm[+throttleT]  simulated partition of a catalog GPU
  <any of these>,mem=SIZE   memory budget, e.g. mem=40GB, mem=40GiB, mem=512MB"""


class DeviceKind(str, enum.Enum):
    """CUDA: a whole GPU. PARTITION: a GPU restricted to some SMs. CPU: a CPU virtual device. SIM: a catalog GPU."""

    CUDA = "cuda"
    PARTITION = "partition"
    CPU = "cpu"
    SIM = "sim"


@dataclass(frozen=True)
class EmulationProfile:
    """A named way to make an H200 resemble one side of a real heterogeneous pair.

    Attributes:
        sms: SMs of the partition (``None`` = the whole GPU).
        throttle_sms: SMs of the bandwidth-throttling streamer (0 = none).
        memory_budget: bytes the device may use.
        mimics: the real GPU whose role it plays, and how.
    """

    sms: int | None
    throttle_sms: int
    memory_budget: int
    mimics: str


EMULATION_PROFILES = {
    "a100-like": EmulationProfile(64, 0, 80 * 10**9, "A100 beside an L40S: bandwidth-rich, compute-poor, 80 GB"),
    "l40s-like": EmulationProfile(88, 44, 48 * 10**9, "L40S beside an A100: compute-rich, bandwidth-poor, cheaper, 48 GB"),
    "h100-like": EmulationProfile(None, 0, 80 * 10**9, "H100 beside an RTX PRO 6000: strong in both, 80 GB"),
    "rtxpro-like": EmulationProfile(64, 40, 96 * 10**9, "RTX PRO 6000 beside an H100: half the compute, throttled "
                                    "bandwidth, more memory, cheaper"),
}


@dataclass(frozen=True)
class DeviceSpec:
    """A device in explicit units.

    Attributes:
        name: canonical device string (``"cuda:1@72sm+throttle36,mem=40GB"``).
        kind: see :class:`DeviceKind`.
        index: CUDA ordinal or CPU virtual index; ``None`` for simulated devices.
        model: GPU model name (``"NVIDIA H200"``), or ``"cpu"``.
        arch: ``"sm_XX"``, or ``"cpu"``.
        sm_count: SMs the device may use (granted, or predicted until the green context exists).
        total_sms: SMs of the whole GPU.
        peak_bf16_flops: dense bf16/fp16 tensor-core peak, FLOP/s.
        peak_fp32_flops: non-tensor fp32 peak, FLOP/s.
        mem_bandwidth: DRAM bandwidth available to the device, bytes/s.
        memory_bytes: bytes the device may use (the budget when one is set, else the capacity).
        price_per_hour: in :data:`torch_tessera.target.prices.UNIT`.
        price_source: where the price comes from (or the assumption behind it).
        price_date: ISO date of the price.
        figures_source: where the peaks come from.
        requested_sms: SMs asked for (partitions), else ``None``.
        throttle_sms: SMs of the bandwidth-throttling streamer (0 = none).
        memory_budget: the budget in bytes, if one was set.
        profile: emulation profile name, if one was used.
        catalog_key: the catalog entry the figures come from, if any.
    """

    name: str
    kind: DeviceKind
    index: int | None
    model: str
    arch: str
    sm_count: int
    total_sms: int
    peak_bf16_flops: float
    peak_fp32_flops: float
    mem_bandwidth: float
    memory_bytes: int
    price_per_hour: float
    price_source: str
    price_date: str
    figures_source: str
    requested_sms: int | None = None
    throttle_sms: int = 0
    memory_budget: int | None = None
    profile: str | None = None
    catalog_key: str | None = None

    @property
    def is_gpu(self) -> bool:
        """True for devices that run on a real CUDA GPU (whole or partition)."""
        return self.kind in (DeviceKind.CUDA, DeviceKind.PARTITION)

    @property
    def cache_identity(self) -> str:
        """What a measurement on this device depends on: model, arch, SMs, throttle (a profiler cache key part)."""
        return f"{self.model}|{self.arch}|{self.sm_count}/{self.total_sms}sm|throttle{self.throttle_sms}"


# ---------------------------------------------------------------------------------------------------------- parsing

_HEAD = re.compile(r"^(?P<kind>cuda|gpu|cpu|sim)(?::(?P<id>[a-z0-9._-]+))?(?:@(?P<part>[a-z0-9.+_-]+))?$")
_PART = re.compile(r"^(?P<sms>\d+)sm(?:\+throttle(?P<thr>\d+)(?:sm)?)?$")
_SIZE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>|b|kb|mb|gb|tb|kib|mib|gib|tib)$")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
OPTIONS = ("mem",)


def _bad(s: str, why: str) -> DeviceUnavailableError:
    forms = ACCEPTED_FORMS.format(profiles=", ".join(EMULATION_PROFILES), sims=", ".join(catalog.CATALOG))
    return DeviceUnavailableError(f"bad device string {s!r}: {why}\n{forms}")


def parse_size(text: str) -> int:
    """Bytes in a size such as ``40GB`` (1e9), ``40GiB`` (2**30), ``512MB`` or ``123456``.

    Raises:
        ValueError: not a size.
    """
    m = _SIZE.match(text.strip().lower())
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 40GB, 40GiB, 512MB, 123456)")
    return int(float(m["num"]) * _UNITS[m["unit"]])


def format_bytes(nbytes: float, scale_of: float | None = None) -> str:
    """A byte count in the largest decimal unit that keeps ``scale_of`` (default ``nbytes``) at least 1:
    ``"1.50 KB"``, ``"41.20 GB"``; pass the largest figure of a message as ``scale_of`` so all share one unit."""
    ref = abs(nbytes if scale_of is None else scale_of)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if ref >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def _format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("GB", 10**9), ("MiB", 2**20), ("MB", 10**6), ("KiB", 2**10), ("KB", 10**3)):
        if nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


@dataclass(frozen=True)
class _Request:
    kind: str
    ident: str
    sms: int | None
    throttle: int
    profile: str | None
    mem: int | None


def _parse_request(s: str, options: Sequence[str] = ()) -> _Request:
    text = s.strip().lower()
    m = _HEAD.match(text)
    if not m:
        if re.match(r"^(cuda|gpu|cpu|sim)\b", text):
            raise _bad(s, "malformed after the device kind (a number or catalog name after ':', a part after '@')")
        raise _bad(s, "it does not start with cuda: (or its alias gpu:), cpu: or sim:")
    kind = "cuda" if m["kind"] == "gpu" else m["kind"]
    ident = m["id"] if m["id"] is not None else ("0" if kind != "sim" else "")
    if kind in ("cuda", "cpu") and not ident.isdigit():
        raise _bad(s, f"{kind} needs a device number, e.g. {kind}:0")
    if kind == "sim" and not ident:
        raise _bad(s, "sim needs a catalog name, e.g. sim:a100")
    if kind == "cpu" and m["part"]:
        raise _bad(s, "a CPU virtual device has no SM partition")
    sms, throttle, profile, mem = None, 0, None, None
    if m["part"]:
        pm = _PART.match(m["part"])
        if pm:
            sms, throttle = int(pm["sms"]), int(pm["thr"] or 0)
            if sms == 0:
                raise _bad(s, "a partition needs at least 1 SM")
        elif m["part"] in EMULATION_PROFILES and kind == "cuda":
            profile = m["part"]
            p = EMULATION_PROFILES[profile]
            sms, throttle, mem = p.sms, p.throttle_sms, p.memory_budget
        else:
            raise _bad(s, f"{m['part']!r} after '@' is neither <K>sm[+throttle<T>] nor a profile "
                          f"({', '.join(EMULATION_PROFILES)})")
    for opt in options:
        key, _, value = opt.strip().lower().partition("=")
        if key not in OPTIONS:
            raise _bad(s, f"unknown option {key!r} (known: {', '.join(OPTIONS)})")
        try:
            mem = parse_size(value)
        except ValueError as exc:
            raise _bad(s, str(exc)) from None
        if mem <= 0:
            raise _bad(s, "mem must be positive")
    return _Request(kind, ident, sms, throttle, profile, mem)


def _canonical(req: _Request) -> str:
    name = f"{req.kind}:{req.ident}"
    if req.profile:
        name += f"@{req.profile}"
    elif req.sms is not None:
        name += f"@{req.sms}sm" + (f"+throttle{req.throttle}" if req.throttle else "")
    if req.mem is not None and not (req.profile and req.mem == EMULATION_PROFILES[req.profile].memory_budget):
        name += f",mem={_format_size(req.mem)}"
    return name


# ------------------------------------------------------------------------------------------------ figures of devices

def partition_bandwidth(bandwidth: float, total_sms: int, sms: int, throttle_sms: int = 0) -> float:
    """Modelled DRAM bandwidth (bytes/s) of ``sms`` of ``total_sms`` SMs, with a streamer on ``throttle_sms`` others.

    See the module docstring for the model and the H200 measurements behind it.
    """
    scale = 0.33 * total_sms

    def demand(n: int) -> float:
        return bandwidth * (1 - math.exp(-n / scale)) / (1 - math.exp(-1 / 0.33))

    own = demand(sms)
    if throttle_sms <= 0:
        return own
    other = demand(throttle_sms)
    return own if own + other <= bandwidth else bandwidth * own / (own + other)


#: Measured share of the whole GPU's peaks that an SM partition keeps, used instead of the model above where measured:
#: (catalog key, granted SMs) -> (bf16 GEMM share, copy bandwidth share), each a fraction of the whole GPU's figure
#: (TFLOP/s and GB/s of one H200 in green contexts, no streamer; docs/BENCHMARKS.md, measured peaks).
MEASURED_PARTITION_SHARE: dict[tuple[str, int], tuple[float, float]] = {
    ("h200", 72): (485 / 814, 3818 / 4242),
    ("h200", 24): (167 / 814, 1756 / 4242),
}


#: Progress rate of a launch on one SM partition while another partition of the same GPU runs a launch, as a fraction
#: of its solo speed, beyond what the DRAM shared by SM count explains (measured on an H200: docs/BENCHMARKS.md,
#: partition co-run).
PARTITION_CORUN_RATE = 0.75


@dataclass(frozen=True)
class _Hardware:
    model: str
    arch: str
    major: int
    total_sms: int
    memory: int
    entry: catalog.CatalogEntry | None


def _cuda_hardware(index: int, assume_gpu: str | None) -> _Hardware:
    if torch.cuda.is_available() and index < torch.cuda.device_count():
        p = torch.cuda.get_device_properties(index)
        return _Hardware(p.name, f"sm_{p.major}{p.minor}", p.major, p.multi_processor_count, p.total_memory,
                         catalog.match_gpu_name(p.name))
    if assume_gpu is not None:
        e = catalog.lookup(assume_gpu)
        return _Hardware(e.name, e.arch, int(e.arch[3:-1]), int(e.sm_count.value), int(e.memory_bytes.value), e)
    raise GpuNotPresentError(gpu_missing_fact(f"cuda:{index}"), PYTHON_GPU_FIX)


#: The remedy for a missing GPU named to the Python API (:func:`parse_devices`, :func:`open_device`); the backend
#: and each CLI command give the one that fits them (:meth:`GpuNotPresentError.with_fix`).
PYTHON_GPU_FIX = ("Run on a machine with that GPU; on this one, cpu:0,cpu:1 are CPU virtual devices that run a split "
                  "program, sim:NAME models a catalog GPU for plans, and parse_devices(..., assume_gpu='h200') models "
                  "cuda:N as that catalog GPU.")


def gpu_missing_fact(name: str) -> str:
    """``"cuda:0 is not present: this process sees 0 CUDA GPU(s) (torch 2.13.0+cpu is built without CUDA)."``"""
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    build = f" (torch {torch.__version__} is built without CUDA)" if torch.version.cuda is None else ""
    return f"{name} is not present: this process sees {seen} CUDA GPU(s){build}."


def _gpu_spec(name: str, kind: DeviceKind, index: int | None, hw: _Hardware, req: _Request) -> DeviceSpec:
    e = hw.entry
    nan = float("nan")
    bf16 = e.peak_bf16_flops.value if e else nan
    fp32 = e.peak_fp32_flops.value if e else nan
    bw = e.mem_bandwidth.value if e else nan
    src = f"datasheet: {e.name} (target/catalog.py)" if e else f"unknown model {hw.model!r}: no peaks, profile it"
    price = prices.price_of(e.key) if e else prices.price_of(hw.model)
    sms, requested = hw.total_sms, None
    if req.sms is not None:
        requested = req.sms
        sms = green.predict_granted_sms(req.sms, hw.major, hw.total_sms)
        if sms + req.throttle > hw.total_sms:
            raise DeviceUnavailableError(
                f"{name}: {sms} SMs for the partition plus {req.throttle} for the streamer exceed the GPU's "
                f"{hw.total_sms} SMs; lower the throttle to at most {hw.total_sms - sms}"
            )
        measured = MEASURED_PARTITION_SHARE.get((e.key, sms)) if e else None
        if measured:
            # the streamer takes bandwidth, not the partition's SMs: compute keeps the measured share
            bf16, fp32 = bf16 * measured[0], fp32 * measured[0]
            bw = bw * measured[1] if not req.throttle else partition_bandwidth(bw, hw.total_sms, sms, req.throttle)
            src += (f"; partition {sms}/{hw.total_sms} SMs: measured share {measured[0]:.3f} of peak FLOP/s"
                    + (f", {measured[1]:.3f} of bandwidth (MEASURED_PARTITION_SHARE)" if not req.throttle else
                       f" (MEASURED_PARTITION_SHARE); bandwidth from the model with a {req.throttle}-SM streamer"))
        else:
            bf16, fp32 = bf16 * sms / hw.total_sms, fp32 * sms / hw.total_sms
            bw = partition_bandwidth(bw, hw.total_sms, sms, req.throttle)
            src += (f"; partition model: {sms}/{hw.total_sms} SMs"
                    + (f", throttle {req.throttle} SMs" if req.throttle else ""))
        price = prices.partition_price(price, sms, hw.total_sms)
        if kind is DeviceKind.CUDA:
            kind = DeviceKind.PARTITION
    memory = hw.memory
    if req.mem is not None:
        if req.mem > hw.memory:
            raise DeviceUnavailableError(f"{name}: memory budget {req.mem} bytes exceeds the {hw.memory} bytes of "
                                         f"{hw.model}; lower mem=")
        memory = req.mem
    return DeviceSpec(name, kind, index, hw.model, hw.arch, sms, hw.total_sms, bf16, fp32, bw, int(memory),
                      price.per_hour, price.source, price.date, src, requested, req.throttle, req.mem, req.profile,
                      e.key if e else None)


CPU_FIGURES = dict(peak_bf16_flops=50e9, peak_fp32_flops=100e9, mem_bandwidth=10e9)  # nominal, for tests only


def _cpu_spec(name: str, req: _Request) -> DeviceSpec:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 * 10**9
    memory = req.mem if req.mem is not None else memory
    return DeviceSpec(name, DeviceKind.CPU, int(req.ident), "cpu", "cpu", 1, 1, memory_bytes=int(memory),
                      price_per_hour=prices.CPU_PRICE.per_hour, price_source=prices.CPU_PRICE.source,
                      price_date=prices.CPU_PRICE.date, figures_source="nominal CPU figures for tests, not measured",
                      memory_budget=req.mem, **CPU_FIGURES)


def parse_device(s: str, *, assume_gpu: str | None = None, _options: Sequence[str] = ()) -> DeviceSpec:
    """The :class:`DeviceSpec` a device string denotes (see the module docstring for the forms).

    Args:
        s: device string, e.g. ``"cuda:1@24sm"``, ``"sim:l40s,mem=40GB"``, ``"cpu:1"``.
        assume_gpu: catalog key of the GPU to assume for ``cuda:`` strings on a machine that lacks that GPU
            (planning elsewhere); ``None`` makes a missing GPU an error.

    Raises:
        DeviceUnavailableError: the string is malformed (the message lists the accepted forms), names a GPU this
            machine lacks, or asks for more SMs or memory than the GPU has.
    """
    head, *options = [p for p in s.split(",")]
    req = _parse_request(head, list(_options) + options)
    name = _canonical(req)
    if req.kind == "cpu":
        return _cpu_spec(name, req)
    if req.kind == "sim":
        e = catalog.lookup(req.ident)
        req = dataclasses.replace(req, ident=e.key)
        name = _canonical(req)
        hw = _Hardware(e.name, e.arch, int(e.arch[3:-1]), int(e.sm_count.value), int(e.memory_bytes.value), e)
        return _gpu_spec(name, DeviceKind.SIM, None, hw, req)
    index = int(req.ident)
    return _gpu_spec(name, DeviceKind.CUDA, index, _cuda_hardware(index, assume_gpu), req)


def split_devices(devices: str | Sequence[str]) -> list[str]:
    """The device strings of a device list, each with its ``key=value`` pieces: ``"cpu:0,mem=1KB,cpu:1"`` and
    ``["cpu:0,mem=1KB", "cpu:1"]`` both give ``["cpu:0,mem=1KB", "cpu:1"]`` (the syntax is not checked here).

    Args:
        devices: comma-separated device strings, or a sequence of them (each may carry its own pieces).

    Raises:
        DeviceUnavailableError: a ``key=value`` piece before any device, or no device at all.
    """
    text = devices if isinstance(devices, str) else ",".join(devices)
    groups: list[list[str]] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece:
            if not groups:
                raise _bad(text, f"option {piece!r} comes before any device")
            groups[-1].append(piece)
        else:
            groups.append([piece])
    if not groups:
        raise _bad(text, "no device given")
    return [",".join(g) for g in groups]


def repeated_devices(names: Sequence[str]) -> str | None:
    """``"<names> appears twice; give each device once"`` when a device name is given more than once, else None."""
    dup = sorted({n for n in names if names.count(n) > 1})
    return f"{', '.join(dup)} appears twice; give each device once" if dup else None


def parse_devices(s: str | Sequence[str], *, assume_gpu: str | None = None) -> list[DeviceSpec]:
    """Several devices separated by commas; ``key=value`` pieces belong to the device before them
    (:func:`split_devices`). A simulated catalog GPU given again is another GPU of that model: the second is named
    ``<name>#2``, the third ``<name>#3`` (``sim:h100,sim:h100`` -> ``sim:h100``, ``sim:h100#2``).

    Raises:
        DeviceUnavailableError: as :func:`parse_device`, or a real device (``cuda:N``, ``cpu:N``...) appears twice.
    """
    specs = _number_repeated_sims([parse_device(d, assume_gpu=assume_gpu) for d in split_devices(s)])
    twice = repeated_devices([d.name for d in specs])
    if twice:
        raise _bad(s if isinstance(s, str) else ",".join(s), twice)
    _check_shared_budgets(specs, s if isinstance(s, str) else ",".join(s), assume_gpu)
    return specs


def _number_repeated_sims(specs: list[DeviceSpec]) -> list[DeviceSpec]:
    """``specs`` with each repeat of a simulated device (``sim:``, no CUDA index) renamed ``<name>#<k>``: two catalog
    GPUs of one model are two GPUs, and cost tables and links tell devices apart by name."""
    import dataclasses

    seen: dict[str, int] = {}
    out = []
    for sp in specs:
        if sp.name.startswith("sim:") and sp.index is None:
            seen[sp.name] = seen.get(sp.name, 0) + 1
            if seen[sp.name] > 1:
                sp = dataclasses.replace(sp, name=f"{sp.name}#{seen[sp.name]}")
        out.append(sp)
    return out


def _check_shared_budgets(specs: Sequence[DeviceSpec], text: str, assume_gpu: str | None) -> None:
    """Partitions of one GPU (same CUDA index) share its memory: their ``mem=`` budgets together must fit it.

    Raises:
        DeviceUnavailableError: the budgets of one GPU's partitions add up to more than the GPU's memory.
    """
    groups: dict[int, list[DeviceSpec]] = {}
    for sp in specs:
        if sp.is_gpu and sp.index is not None:
            groups.setdefault(sp.index, []).append(sp)
    for index, members in groups.items():
        budgeted = [sp for sp in members if sp.memory_budget is not None]
        if len(members) < 2 or not budgeted:
            continue
        whole = next((sp.memory_bytes for sp in members if sp.memory_budget is None), None)
        if whole is None:
            whole = parse_device(f"cuda:{index}", assume_gpu=assume_gpu).memory_bytes
        given = sum(sp.memory_budget for sp in budgeted)
        if given > whole:
            raise DeviceUnavailableError(
                f"devices {text!r}: the mem= budgets of cuda:{index}'s partitions "
                f"({', '.join(sp.name for sp in budgeted)}) add up to {format_bytes(given)}, more than the "
                f"{format_bytes(whole)} of its {members[0].model}; partitions of one GPU share its memory, so lower "
                "the budgets")


def parse_run_devices(s: str, what: str) -> tuple[list[DeviceSpec], bool, str]:
    """Devices a measured run places programs over: at least two, all GPUs or all CPU virtual devices.

    Args:
        s: comma-separated device strings (:func:`parse_devices`).
        what: who asks, for the error messages (e.g. ``"--measure"``).

    Returns:
        ``(specs, on_cuda, home)`` where ``home`` is the torch device the model's tensors go to.

    Raises:
        ConfigError: fewer than two devices, or GPUs mixed with CPU devices.
        DeviceUnavailableError: a device string that is not available here.
    """
    from torch_tessera.errors import ConfigError

    specs = parse_devices(s)
    if len(specs) < 2:
        raise ConfigError(f"{what} places programs over several devices; got {s!r}")
    on_cuda = all(sp.is_gpu for sp in specs)
    if any(sp.is_gpu for sp in specs) != on_cuda:
        raise ConfigError(f"{what} needs all GPUs or all CPU virtual devices, not a mix")
    return specs, on_cuda, (f"cuda:{specs[0].index}" if on_cuda else "cpu")


def detect_gpus() -> list[DeviceSpec]:
    """Specs of the whole CUDA GPUs this process sees (empty without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [parse_device(f"cuda:{i}") for i in range(torch.cuda.device_count())]


# ----------------------------------------------------------------------------------------------------- runtime objects

class CpuEvent:
    """Stand-in for ``torch.cuda.Event`` on a CPU virtual device: CPU work is synchronous, so it is always complete."""

    def record(self, stream: object = None) -> None:
        return None

    def wait(self, stream: object = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuStream:
    """Stand-in for ``torch.cuda.Stream`` on a CPU virtual device (work runs in order, at once)."""

    def __init__(self, priority: int = 0):
        self.priority = priority

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        return event or CpuEvent()

    def wait_event(self, event: object) -> None:
        return None

    def wait_stream(self, stream: object) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


def _with_granted(spec: DeviceSpec, granted: int) -> DeviceSpec:
    """``spec`` with the SM count the driver actually granted (figures rescaled by the partition model)."""
    if granted == spec.sm_count:
        return spec
    log.warning("%s: predicted %d SMs, driver granted %d; rescaling its figures", spec.name, spec.sm_count, granted)
    e = catalog.CATALOG.get(spec.catalog_key or "")
    bw = (partition_bandwidth(e.mem_bandwidth.value, spec.total_sms, granted, spec.throttle_sms) if e
          else spec.mem_bandwidth)
    scale = granted / spec.sm_count
    return dataclasses.replace(spec, sm_count=granted, peak_bf16_flops=spec.peak_bf16_flops * scale,
                               peak_fp32_flops=spec.peak_fp32_flops * scale, mem_bandwidth=bw,
                               price_per_hour=spec.price_per_hour * scale)


class Device:
    """A device kernels run on: a whole GPU, an SM partition of one, or a CPU virtual device.

    Attributes:
        spec: the device in explicit units (for a partition, with the SM count actually granted).
        torch_device: where its tensors live (``cuda:N``, or ``cpu`` for every CPU virtual device).
        partition: the green-context partition, for a partition device.
        streamer: the bandwidth-throttling streamer, when the spec asks for one (running while the device is open).
    """

    def __init__(self, spec: DeviceSpec, partition: green.GreenPartition | None = None,
                 streamer: green.BandwidthStreamer | None = None, streamer_partition: green.GreenPartition | None = None):
        self.spec = spec
        self.partition = partition
        self.streamer = streamer
        self._streamer_partition = streamer_partition
        self.torch_device = torch.device("cuda", spec.index) if spec.is_gpu else torch.device("cpu")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def default_stream(self) -> torch.cuda.Stream | CpuStream:
        """The stream work on this device goes to unless the executor makes others (a partition's own stream)."""
        if self.partition is not None:
            return self.partition.stream
        if self.spec.is_gpu:
            return torch.cuda.current_stream(self.torch_device)
        return CpuStream()

    def new_stream(self, priority: int = 0) -> torch.cuda.Stream | CpuStream:
        """A new stream on this device (``priority``: lower is more urgent; CUDA allows -5..0 on recent GPUs).

        A partition's streams are created in its green context, so their work stays on its SMs.
        """
        if self.partition is not None:
            return self.partition.new_stream(priority)
        if self.spec.is_gpu:
            return torch.cuda.Stream(device=self.torch_device, priority=priority)
        return CpuStream(priority)

    def guard(self) -> contextlib.AbstractContextManager:
        """Context manager making this device current (CUDA kernels must be loaded and launched under it)."""
        if self.spec.is_gpu:
            return torch.cuda.device(self.spec.index)
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait for all work queued on this device."""
        if self.spec.is_gpu:
            torch.cuda.synchronize(self.torch_device)

    def close(self) -> None:
        """Stop the streamer and release the green contexts."""
        if self.streamer is not None:
            self.streamer.stop()
            self.streamer = None
        for p in (self.partition, self._streamer_partition):
            if p is not None:
                p.close()
        self.partition = self._streamer_partition = None

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Device({self.spec.name!r}, {self.spec.sm_count} SMs, {self.torch_device})"


def check_present(spec: DeviceSpec) -> None:
    """Raise :class:`~torch_tessera.errors.GpuNotPresentError` (with :data:`PYTHON_GPU_FIX`) when ``spec`` is a GPU
    or a partition of one that this machine does not have; CPU and simulated devices pass."""
    if spec.is_gpu and spec.index is not None and not (torch.cuda.is_available()
                                                       and spec.index < torch.cuda.device_count()):
        raise GpuNotPresentError(gpu_missing_fact(spec.name), PYTHON_GPU_FIX)


def assumed_note(specs: Sequence[DeviceSpec], model: str = "H200") -> str | None:
    """The note a planning command prints when some of ``specs`` are GPUs this machine does not have (planned from
    the catalog's ``model`` figures in their place); None when every GPU named is present."""
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = sorted({sp.index for sp in specs if sp.is_gpu and sp.index is not None and sp.index >= present})
    if not missing:
        return None
    return (f"note: cuda:{', cuda:'.join(map(str, missing))} not present on this machine ({present} CUDA GPU(s)): "
            f"planning {'it' if len(missing) == 1 else 'each'} as an {model} (catalog figures)")


def open_device(device: DeviceSpec | str, *, start_streamer: bool = True) -> Device:
    """Make the runtime object for a device: create its green context and start its streamer if it has them.

    Args:
        device: a spec or a device string.
        start_streamer: start the bandwidth-throttling streamer now (it runs until :meth:`Device.close`).

    Raises:
        DeviceUnavailableError: a simulated device (plan with it, run on cuda/cpu), or the GPU / green contexts are
            not available here.
    """
    spec = parse_device(device) if isinstance(device, str) else device
    if spec.kind is DeviceKind.SIM:
        raise DeviceUnavailableError(f"{spec.name} is simulated: it has costs but no runtime; run on cuda:N or cpu:N")
    if spec.kind is not DeviceKind.PARTITION:
        check_present(spec)
        return Device(spec)
    part, reserve = green.create_partition(spec.index, spec.requested_sms, spec.throttle_sms)
    spec = _with_granted(spec, part.granted_sms)
    streamer = None
    if reserve is not None:
        streamer = green.BandwidthStreamer(reserve.stream, spec.index)
        if start_streamer:
            streamer.start()
    return Device(spec, part, streamer, reserve)
