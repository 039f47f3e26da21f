"""Disk caches of lowering: lowered kernel programs, so that commands over many devices (census, pairs, advise) lower
a full-size model once; and codegen records, so that an Inductor FX graph cache hit needs no codegen.

Location: ``$TESSERA_CACHE_DIR/programs``, else ``~/.cache/torch_tessera/programs``; one pickle per key, written
atomically. The key names what was lowered (model, size, shape) and the torch and Triton versions: a program
lowered by another version is lowered again. An unreadable entry is logged and lowered again, never trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pickle
from pathlib import Path
from typing import Callable, Sequence

import torch
import triton

from torch_tessera import knobs
from torch_tessera.compat.torch_inductor import CodegenEvent
from torch_tessera.lowering.program import KernelProgram

log = logging.getLogger(__name__)


def cache_root() -> Path:
    """``$TESSERA_CACHE_DIR/programs``, else ``~/.cache/torch_tessera/programs``."""
    return knobs.cache_dir("programs")


def _path(key: str) -> Path:
    digest = hashlib.sha256(f"{key}|torch {torch.__version__}|triton {triton.__version__}".encode()).hexdigest()
    return cache_root() / f"{digest[:24]}.pkl"


def cached_program(key: str, lower: Callable[[], KernelProgram], use_cache: bool = True) -> KernelProgram:
    """The program lowered by ``lower()``, from the cache when ``key`` was lowered before by these versions.

    Args:
        key: what is lowered, e.g. ``"llama/full/prefill/b1/t1024/ctx1088"``; the caller makes it unique.
        lower: lowers the program (called on a miss).
        use_cache: ``False``: always lower and do not write.
    """
    if not use_cache:
        return lower()
    path = _path(key)
    if path.exists():
        try:
            with path.open("rb") as f:
                program = pickle.load(f)
            if isinstance(program, KernelProgram):
                log.info("lowered program %s from the cache (%s)", key, path)
                return program
            log.warning("program cache entry %s is not a KernelProgram; lowering again", path)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
            log.warning("unreadable program cache entry %s (%s); lowering again", path, e)
    program = lower()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with tmp.open("wb") as f:
            pickle.dump(program, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
    except (OSError, pickle.PicklingError, TypeError) as e:
        log.warning("could not cache lowered program %s: %s", key, e)
    return program


def _codegen_path(source_key: str) -> Path:
    digest = hashlib.sha256(f"{source_key}|torch {torch.__version__}".encode()).hexdigest()
    return knobs.cache_dir("codegen") / f"{digest[:32]}.json"


def load_codegen_record(source_key: str) -> list[CodegenEvent] | None:
    """The codegen events saved for the generated module whose source hashes to ``source_key``, or ``None`` (never
    saved, or unreadable: logged)."""
    path = _codegen_path(source_key)
    try:
        rows = json.loads(path.read_text())["events"]
        return [CodegenEvent(r["kind"], r["name"], tuple(r["aten_ops"]), tuple(r["fx_nodes"]),
                             tuple(r["module_paths"])) for r in rows]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("unreadable codegen record %s (%s); Inductor generates the graph again", path, e)
        return None


def save_codegen_record(source_key: str, events: Sequence[CodegenEvent]) -> None:
    """Save ``events`` for the generated module whose source hashes to ``source_key`` (atomic; a failure is logged,
    and only costs a codegen the next time)."""
    path = _codegen_path(source_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"events": [dataclasses.asdict(e) for e in events]}))
        tmp.replace(path)
    except OSError as e:
        log.warning("could not save codegen record %s: %s", path, e)
