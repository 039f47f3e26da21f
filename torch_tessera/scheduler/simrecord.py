"""What a simulation of a schedule needs, as JSON, so that a GPU run's predictions can be recomputed offline.

A record holds a schedule (:func:`schedule_to_json`: the lossless form of
:func:`~torch_tessera.scheduler.pipeline_schedule.schedule_to_data`, every step with its byte ranges and edges), the
per-launch costs (:func:`costs_to_json`), the links (:func:`links_to_json`) and the DRAM figures
(:func:`memory_to_json`); :func:`resimulate` runs :func:`~torch_tessera.scheduler.simulate.simulate` on them again,
with any issue model.

:func:`schedule_from_json` also reads the older, lossy form (records written before session 14: ``placement`` a
mapping, steps ``["run", micro_batch, launch]``, ``["transfer", micro_batch, src, dst, nbytes, purpose]``,
``["record", micro_batch, event_id]``, ``["wait", micro_batch, event_id]``; transfers without byte ranges, waits
without edges), enough for the simulator.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from torch_tessera.errors import ConfigError
from torch_tessera.scheduler.issue import GraphIssue, HostIssue
from torch_tessera.scheduler.pipeline_schedule import (PipelinedSchedule, RecordStep, RunStep, TransferStep, WaitStep,
                                                       schedule_from_data, schedule_to_data)
from torch_tessera.scheduler.simulate import MemoryShare, simulate
from torch_tessera.target.costs import CostTable, Topology


def schedule_to_json(schedule: PipelinedSchedule) -> dict[str, Any]:
    """``schedule`` as JSON-ready data, lossless
    (:func:`~torch_tessera.scheduler.pipeline_schedule.schedule_to_data`; :func:`schedule_from_json` reads it back
    equal)."""
    return schedule_to_data(schedule)


def schedule_from_json(data: Mapping[str, Any]) -> PipelinedSchedule:
    """The schedule of a record: :func:`schedule_to_json`'s lossless form, or the older lossy form (the module
    docstring; its transfers come back without byte ranges and its waits without edges).

    Raises:
        ConfigError: a step of an unknown kind or shape, or a field missing (the message names it).
    """
    if isinstance(data.get("placement"), Mapping):
        return _schedule_from_lossy(data)
    try:
        return schedule_from_data(data)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ConfigError(f"schedule record: {type(e).__name__}: {e}; expected the form schedule_to_json writes "
                          "(torch_tessera.scheduler.pipeline_schedule.schedule_to_data)") from e


def _schedule_from_lossy(data: Mapping[str, Any]) -> PipelinedSchedule:
    """The older lossy record (transfers without byte ranges, waits without edges)."""
    streams = []
    for d, st in enumerate(data["streams"]):
        out = []
        for step in st:
            kind, mb = step[0], int(step[1])
            if kind == "run":
                out.append(RunStep(d, mb, int(step[2])))
            elif kind == "transfer":
                out.append(TransferStep(int(step[2]), int(step[3]), mb, None, (), int(step[4]), str(step[5])))
            elif kind == "record":
                out.append(RecordStep(d, mb, int(step[2])))
            elif kind == "wait":
                out.append(WaitStep(d, mb, int(step[2])))
            else:
                raise ConfigError(f"schedule record: step {step!r} of device {d} has kind {kind!r}; known: run, "
                                  "transfer, record, wait")
        streams.append(tuple(out))
    return PipelinedSchedule(int(data["devices"]), int(data["micro_batches"]), tuple(streams),
                             {int(k): int(v) for k, v in data["placement"].items()},
                             tuple(int(x) for x in data["domains"]), tuple(tuple(e) for e in data["cut_edges"]),
                             source=str(data["source"]))


def costs_to_json(costs: CostTable) -> dict[str, Any]:
    """Per device (column), the seconds of every launch (row, ``kernels`` order), and where they come from."""
    return {"devices": list(costs.devices), "kernels": list(costs.kernels), "seconds": costs.seconds.tolist(),
            "source": costs.source}


def costs_from_json(data: Mapping[str, Any]) -> CostTable:
    return CostTable(tuple(data["devices"]), tuple(int(k) for k in data["kernels"]),
                     np.asarray(data["seconds"], dtype=np.float64), str(data["source"]))


def links_to_json(topology: Topology | None) -> dict[str, Any] | None:
    """The link bandwidth (bytes/s) and latency (s) matrices the simulator's transfers read; None for none."""
    if topology is None:
        return None
    return {"devices": list(topology.devices), "bandwidth": np.asarray(topology.bandwidth).tolist(),
            "latency": np.asarray(topology.latency).tolist(), "source": topology.source}


def links_from_json(data: Mapping[str, Any] | None) -> Topology | None:
    if data is None:
        return None
    return Topology(tuple(data["devices"]), np.asarray(data["bandwidth"], dtype=np.float64),
                    np.asarray(data["latency"], dtype=np.float64), source=str(data["source"]))


def memory_to_json(memory: MemoryShare | None) -> dict[str, Any] | None:
    """The DRAM figures of :class:`~torch_tessera.scheduler.simulate.MemoryShare`; None for none."""
    if memory is None:
        return None
    return {"launch_bytes": {str(k): float(v) for k, v in memory.launch_bytes.items()},
            "device_bandwidth": [float(x) for x in memory.device_bandwidth],
            "domain_bandwidth": {str(k): float(v) for k, v in memory.domain_bandwidth.items()},
            "weights": [float(x) for x in memory.weights], "corun_rate": float(memory.corun_rate)}


def memory_from_json(data: Mapping[str, Any] | None) -> MemoryShare | None:
    if data is None:
        return None
    return MemoryShare({int(k): v for k, v in data["launch_bytes"].items()}, tuple(data["device_bandwidth"]),
                       {int(k): v for k, v in data["domain_bandwidth"].items()}, tuple(data["weights"]),
                       float(data["corun_rate"]))


def resimulate(schedule: Mapping[str, Any], inputs: Mapping[str, Any], *, host: HostIssue | None = None,
               graph: GraphIssue | None = None) -> float:
    """Seconds of one replay of a recorded schedule (:func:`~torch_tessera.scheduler.simulate.simulate`).

    Args:
        schedule: :func:`schedule_to_json`'s record (or the older lossy form).
        inputs: ``{"costs": costs_to_json(...), "links": links_to_json(...), "memory": memory_to_json(...),
            "wait_seconds": float}``.
        host / graph: the issue model (:class:`HostIssue`: eager replay; :class:`GraphIssue`: one CUDA graph with
            event-timed costs; neither: a graph with costs taken whole).

    Raises:
        ConfigError: a record misses a key (named), or a step of an unknown kind.
    """
    missing = [k for k in ("costs", "links", "memory", "wait_seconds") if k not in inputs]
    if missing:
        raise ConfigError(f"simulation record misses {missing}: it was written before the costs were saved; rerun "
                          "the GPU bench to get a record that can be re-simulated")
    return simulate(schedule_from_json(schedule), costs_from_json(inputs["costs"]), links_from_json(inputs["links"]),
                    wait_seconds=float(inputs["wait_seconds"]), memory=memory_from_json(inputs["memory"]),
                    host=host, graph=graph).step_seconds
