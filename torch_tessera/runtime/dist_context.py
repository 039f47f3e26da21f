"""Joining and leaving a multi-process run: this rank's :class:`DistContext` (``torchrun`` rendezvous, process
groups), the plan every rank agrees on (:func:`agree_on_plan`, :func:`agree_on_schedules`), and :func:`shutdown`.
The executor that runs a plan's share on each rank is :class:`~torch_tessera.runtime.distributed.DistributedExecutor`.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from torch_tessera.errors import ConfigError, RendezvousError
from torch_tessera.lowering.program import KernelProgram
from torch_tessera.runtime.dist_replay import probe_group
from torch_tessera.runtime.executor import launch_buffers
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """This process's place in a multi-process run.

    Attributes:
        rank: this process's rank, which is also its device index in placements.
        world_size: number of ranks.
        backend: ``"nccl"`` (CUDA devices) or ``"gloo"`` (CPU).
        device: the torch device this rank computes on.
        timeout_s: seconds any wait on a peer may take before :class:`PeerFailureError`.
        control: a gloo group over all ranks for handshakes (``None``: the default group, already gloo).
        hosts: host name of every rank (``socket.gethostname()``), in rank order.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    timeout_s: float
    control: Any = None
    hosts: tuple[str, ...] = ()


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RendezvousError(
            f"environment variable {name} is not set: launch every rank with torchrun "
            f"(torchrun --nproc-per-node N -m torch_tessera.cli dist-run ...)"
        )
    return int(value)


def init_distributed(device: str | torch.device | None = None, timeout_s: float = 30.0,
                     backend: str | None = None) -> DistContext:
    """Join the process group of a ``torchrun`` launch and return this rank's :class:`DistContext`.

    Sets ``NCCL_NVLS_ENABLE=0`` unless already set (NVLink SHARP multicast is off on our machines), makes ``device``
    the current CUDA device, initialises the default group (NCCL for CUDA, gloo for CPU) and a gloo control group,
    and gathers every rank's host name.

    Args:
        device: this rank's device; default ``cuda:$LOCAL_RANK`` when CUDA is available, else ``cpu``.
        timeout_s: seconds a wait on a peer may take (rendezvous included) before an error; the process group's own
            timeout is set to ``max(2 * timeout_s, timeout_s + 30)``, a backstop behind ours.
        backend: ``"nccl"`` or ``"gloo"``; default from the device type.

    Raises:
        RendezvousError: not launched by torchrun, or the ranks could not meet within the timeout.
        ConfigError: a non-positive timeout, or NCCL asked for a CPU device.
    """
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s={timeout_s} must be positive (seconds)")
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local = int(os.environ.get("LOCAL_RANK", rank))
    if device is None:
        device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if backend == "nccl" and dev.type != "cuda":
        raise ConfigError(f"backend nccl needs a CUDA device, rank {rank} was given {dev}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backstop = datetime.timedelta(seconds=max(2 * timeout_s, timeout_s + 30))
    try:
        if not dist.is_initialized():
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=backstop)
        control = dist.new_group(backend="gloo", timeout=backstop) if backend != "gloo" else None
        hosts: list = [None] * world
        dist.all_gather_object(hosts, socket.gethostname(), group=control)
        if backend == "nccl":  # create the communicator now, so that a broken NCCL setup fails here, bounded
            probe_group(None, dev, timeout_s)
    except RuntimeError as e:
        raise RendezvousError(
            f"rank {rank} of {world} could not meet the others at {os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')} ({type(e).__name__}: {e}); check that every rank started and the "
            f"address is reachable"
        ) from e
    log.info("rank %d/%d joined (%s on %s, host %s)", rank, world, backend, dev, hosts[rank])
    return DistContext(rank, world, backend, dev, float(timeout_s), control, tuple(hosts))


def plan_fingerprint(program: KernelProgram, placement: Mapping[int, int]) -> str:
    """A hash of what every rank must agree on: launches, their buffers, buffer sizes and the placement.

    Device names are left out (each rank lowered the program on its own device).
    """
    h = hashlib.sha256()
    for launch in program.launches:
        name = getattr(launch, "kernel", None) or getattr(launch, "op", "")
        h.update(f"{launch.index}:{name}:{sorted(launch_buffers(launch))};".encode())
    for b in sorted(program.buffers.values(), key=lambda b: b.name):
        h.update(f"{b.name}:{b.nbytes}:{b.kind.value};".encode())
    h.update(repr(sorted(placement.items())).encode())
    return h.hexdigest()[:16]


def agree_on_plan(ctx: DistContext, program: KernelProgram, placement: Mapping[int, int] | None) -> dict[int, int]:
    """Rank 0's placement, broadcast to every rank; then check every rank holds the same program.

    Args:
        ctx: this rank's context.
        program: the program this rank lowered (every rank lowers the same model with the same seed).
        placement: launch index -> device (= rank) index; only rank 0's is used (others may pass ``None``).

    Returns:
        Rank 0's placement.

    Raises:
        RendezvousError: a rank's program differs from rank 0's (different model, seed, shapes or torch version).
    """
    box = [dict(placement) if ctx.rank == 0 and placement is not None else None]
    dist.broadcast_object_list(box, src=0, group=ctx.control)
    if box[0] is None:
        raise RendezvousError("rank 0 gave no placement to broadcast")
    chosen = {int(k): int(v) for k, v in box[0].items()}
    prints: list = [None] * ctx.world_size
    dist.all_gather_object(prints, plan_fingerprint(program, chosen), group=ctx.control)
    bad = [r for r, p in enumerate(prints) if p != prints[0]]
    if bad:
        raise RendezvousError(
            f"ranks {bad} lowered a different program than rank 0 (fingerprints {prints}); every rank must build the "
            f"same model with the same seed, input shapes and torch version"
        )
    return chosen


def agree_on_schedules(ctx: DistContext,
                       schedules: Sequence[PipelinedSchedule] | None) -> tuple[PipelinedSchedule, ...]:
    """Rank 0's pipelined schedules (the plan's, for :class:`~torch_tessera.runtime.distributed.DistributedExecutor`'s
    ``schedules``), broadcast to every rank, so that every rank replays the same ones.

    Args:
        ctx: this rank's context.
        schedules: the schedules; only rank 0's are used (others may pass ``None``); ``None`` or empty on rank 0: none.

    Returns:
        Rank 0's schedules (empty when it had none).

    Raises:
        RendezvousError: the broadcast failed.
    """
    box = [tuple(schedules or ()) if ctx.rank == 0 else None]
    try:
        dist.broadcast_object_list(box, src=0, group=ctx.control)
    except RuntimeError as e:
        raise RendezvousError(f"rank {ctx.rank}: could not receive rank 0's schedules ({e}); check rank 0's log") from e
    return tuple(box[0] or ())


def shutdown(ctx: DistContext | None, failed: bool = False) -> None:
    """Leave the process group.

    After a failure (``failed=True``) the process exits at once with status 2 (``os._exit``, after flushing the
    standard streams and logs): with a dead or hung peer, NCCL communicators stay stuck on it and gloo's teardown
    waits for it (about 10 s), so a clean teardown could outlast the timeout the caller asked for.
    """
    if failed:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(2)
    if not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except RuntimeError as e:  # a dead peer can make teardown fail; we are leaving anyway
        log.warning("destroy_process_group: %s", e)
