"""A disk cache of lowered kernel programs, so that commands over many devices (census, pairs, advise) lower a
full-size model once.

Location: ``$TESSERA_CACHE_DIR/programs``, else ``~/.cache/torch_tessera/programs``; one pickle per key, written
atomically. The key names what was lowered (model, size, shape) and the torch and Triton versions: a program
lowered by another version is lowered again. An unreadable entry is logged and lowered again, never trusted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from pathlib import Path
from typing import Callable

import torch
import triton

from torch_tessera import knobs
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
