"""Plans cached on disk, keyed by everything that decides them.

The key hashes the compiled problem (kernel names, op classes, layers, unsure flags, every edge with its bytes, the
cost table, resident buffers, groups and pins, program frequencies), the devices, links (bandwidth, latency, per-hop
overhead and copy exposure) and budgets, and the policy with its options. A changed program, cost, device set or option gives a new key, so a stale plan is never returned.
Files are JSON (:meth:`Plan.to_json`, with the plan's schedules), written atomically; an unreadable file, or one
written before plans carried their schedules (no ``schedules`` field), counts as a miss.

Location: ``cache_dir`` if given, else ``$TESSERA_CACHE_DIR/plans``, else ``~/.cache/torch_tessera/plans``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from torch_tessera import knobs
from torch_tessera.scheduler.problem import Problem
from torch_tessera.scheduler.types import Plan

log = logging.getLogger(__name__)

#: Version of the cached plans: bump when the plan format or the solver's meaning of a key changes (a cached plan of
#: another version is never read).
SCHEMA = 5


def default_dir() -> Path:
    """The plan cache directory: ``$TESSERA_CACHE_DIR/plans`` (:mod:`torch_tessera.knobs`)."""
    return knobs.cache_dir("plans")


def structural_hash(pb: Problem) -> str:
    """Hash of the program structure and costs of a compiled problem (hex, 24 chars)."""
    h = hashlib.sha256()
    for arr in (pb.prog, pb.launch, pb.cost, pb.freq, pb.esrc, pb.edst, pb.ebytes, pb.group, pb.pinned):
        a = np.ascontiguousarray(arr)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    h.update(json.dumps([pb.programs, pb.roles, pb.names, pb.op_class, pb.layer, pb.ekind,
                         [[list(r) for r in rs] for rs in pb.eranges]], default=str).encode())
    h.update(json.dumps([(r.name, r.kind, r.nbytes, r.holders.tolist()) for r in pb.resident]).encode())
    h.update(json.dumps([sorted(r) for r in pb.reads] + [sorted(w) for w in pb.writes]).encode())
    h.update(json.dumps([sorted(t.items()) for t in pb.temp_bytes]).encode())
    return h.hexdigest()[:24]


def plan_key(pb: Problem, policy: str, options: dict) -> str:
    """Cache key: structure + devices + links + budgets (and shared memory pools) + policy + options."""
    h = hashlib.sha256()
    h.update(structural_hash(pb).encode())
    h.update(json.dumps({"schema": SCHEMA, "devices": list(pb.devices), "policy": policy,
                         "micro_batches": pb.micro_batches, "options": options}, sort_keys=True, default=str).encode())
    for arr in (pb.bw, pb.alpha, pb.budgets, pb.hop, pb.expose):
        h.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    if len(pb.pool_budgets):  # shared memory (partitions of one GPU); absent, the key is as it was without pools
        for arr in (pb.pools, pb.pool_budgets):
            h.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    return h.hexdigest()[:32]


def load(directory: Path, key: str) -> Plan | None:
    path = directory / f"{key}.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            return None
        if '"schedules":' not in data["plan"]:
            log.info("plan cache file %s predates plans carrying their schedules; solving again", path)
            return None
        return Plan.from_json(data["plan"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("plan cache file %s unreadable (%s); solving again", path, e)
        return None


def store(directory: Path, key: str, plan: Plan) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "plan": plan.to_json()}, f)
        os.replace(tmp, directory / f"{key}.json")
    except OSError as e:
        log.warning("could not write plan cache in %s: %s", directory, e)
