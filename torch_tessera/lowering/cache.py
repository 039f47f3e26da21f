"""Disk caches of lowering: lowered kernel programs, so that commands over many devices (census, pairs, advise) lower
a full-size model once; codegen records, so that an Inductor FX graph cache hit needs no codegen; and captured
programs, so that an AOTAutograd cache hit (the warm path) needs neither tracing nor a recording run.

Location: ``$TESSERA_CACHE_DIR/programs``, else ``~/.cache/torch_tessera/programs``; one pickle per key, written
atomically. The key names what was lowered (model, size, shape) and the torch and Triton versions: a program
lowered by another version is lowered again. An unreadable entry is logged and lowered again, never trusted.
Codegen records live in ``codegen/`` beside it (one JSON file per generated module, :class:`CodegenRecord`), captured
programs in ``warm/`` (one pickle per generated module and inputs, keyed with the torch and Triton versions and a
digest of the capture code).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any, Callable, Sequence

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
        _write_pickle(path, program)
    except (OSError, pickle.PicklingError, TypeError) as e:
        log.warning("could not cache lowered program %s: %s", key, e)
    return program


def _write_pickle(path: Path, obj: object) -> None:
    """Pickle ``obj`` to ``path`` atomically (a temporary file, then a rename: readers never see half a file).

    Raises:
        OSError, pickle.PicklingError, TypeError, AttributeError: what writing or pickling raised.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)


def _codegen_path(source_key: str) -> Path:
    digest = hashlib.sha256(f"{source_key}|torch {torch.__version__}".encode()).hexdigest()
    return knobs.cache_dir("codegen") / f"{digest[:32]}.json"


#: One inner-graph input as the codegen record stores it: ``("tensor", shape, stride, storage offset, dtype,
#: device)`` or ``("scalar", type name, value)``.
InputMeta = tuple


def input_signature(inputs: Sequence[Any]) -> tuple[InputMeta, ...]:
    """What a kernel program depends on in its inputs (shapes, strides, offsets, dtypes, devices, scalar values),
    as plain JSON-able tuples; the warm path reuses a record only for inputs with this signature.

    Raises:
        TypeError: an input has a symbolic shape or value (only static graphs are recorded).
    """
    out: list[InputMeta] = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out.append(("tensor", tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride()),
                        int(x.storage_offset()), str(x.dtype), str(x.device)))
        elif isinstance(x, (bool, int, float, str, type(None))):
            out.append(("scalar", type(x).__name__, x))
        else:
            raise TypeError(f"input of type {type(x).__name__} has no static signature")
    return tuple(out)


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


@dataclasses.dataclass(frozen=True)
class CodegenRecord:
    """What codegen noted for one generated module, saved so that a cache hit needs neither codegen nor tracing.

    Attributes:
        events: the kernel calls in codegen order (provenance of each launch).
        inputs: :func:`input_signature` of the inner graph's inputs when it was captured; ``None`` in a record that
            was saved without it (the FX-graph-cache path reuses it, the AOTAutograd warm path does not).
        static_input_idxs: the inner graph's static inputs when it was captured (``None`` as above).
    """

    events: tuple[CodegenEvent, ...]
    inputs: tuple[InputMeta, ...] | None = None
    static_input_idxs: tuple[int, ...] | None = None


def load_codegen_record(source_key: str) -> CodegenRecord | None:
    """The record saved for the generated module ``source_key`` names (:func:`torch_tessera.compat.torch_inductor.
    codegen_key`), or ``None`` (never saved, or unreadable: logged)."""
    path = _codegen_path(source_key)
    try:
        data = json.loads(path.read_text())
        events = tuple(CodegenEvent(r["kind"], r["name"], tuple(r["aten_ops"]), tuple(r["fx_nodes"]),
                                    tuple(r["module_paths"])) for r in data["events"])
        inputs, static = data.get("inputs"), data.get("static_input_idxs")
        return CodegenRecord(events, None if inputs is None else _as_tuples(inputs),
                             None if static is None else tuple(int(i) for i in static))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("unreadable codegen record %s (%s); Inductor generates the graph again", path, e)
        return None


def save_codegen_record(source_key: str, record: CodegenRecord) -> None:
    """Save ``record`` for the generated module ``source_key`` names (atomic; a failure is logged, and only costs a
    codegen the next time)."""
    path = _codegen_path(source_key)
    data: dict[str, Any] = {"events": [dataclasses.asdict(e) for e in record.events]}
    if record.inputs is not None:
        data["inputs"] = record.inputs
    if record.static_input_idxs is not None:
        data["static_input_idxs"] = list(record.static_input_idxs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except (OSError, TypeError, ValueError) as e:
        log.warning("could not save codegen record %s: %s", path, e)


def _code_digest() -> str:
    """SHA-256 of the modules that decide what a captured program holds (the program's types and the capture): a
    program captured by other code is captured again, never unpickled into changed types."""
    if not _CODE_DIGEST:
        here = Path(__file__).parent
        h = hashlib.sha256()
        for name in ("program.py", "capture.py", "cache.py"):
            h.update((here / name).read_bytes())
        _CODE_DIGEST.append(h.hexdigest())
    return _CODE_DIGEST[0]


_CODE_DIGEST: list[str] = []


def _warm_path(warm_key: str) -> Path:
    blob = f"{warm_key}|torch {torch.__version__}|triton {triton.__version__}|code {_code_digest()}"
    return knobs.cache_dir("warm") / f"{hashlib.sha256(blob.encode()).hexdigest()[:32]}.pkl"


def load_warm_program(warm_key: str) -> KernelProgram | None:
    """The program saved under ``warm_key`` (what :func:`save_warm_program` was given) by these torch and Triton
    versions and this capture code, or ``None`` (never saved, or unreadable: logged)."""
    path = _warm_path(warm_key)
    try:
        with path.open("rb") as f:
            program = pickle.load(f)
    except FileNotFoundError:
        return None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError) as e:
        log.warning("unreadable captured program %s (%s); capturing it again", path, e)
        return None
    if not isinstance(program, KernelProgram):
        log.warning("captured program %s is not a KernelProgram; capturing it again", path)
        return None
    return program


def save_warm_program(warm_key: str, program: KernelProgram) -> None:
    """Save the program captured for ``warm_key`` (the generated module's key, the inner graph's input signature,
    input names, parameter flags and static inputs); atomic, a failure is logged."""
    path = _warm_path(warm_key)
    try:
        _write_pickle(path, program)
    except (OSError, pickle.PicklingError, TypeError, AttributeError) as e:
        log.warning("could not save captured program %s: %s", path, e)
