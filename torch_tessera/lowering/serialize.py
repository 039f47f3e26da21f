"""A :class:`KernelProgram` as JSON and back: :func:`program_to_json` and its exact inverse :func:`load_program`.

The backend's ``dump_dir`` option writes ``program_<n>.json`` with :func:`program_to_json`, so a later stage (PTX
analysis, the DAG, planning: ``tessera plan --program program_0.json``) can start from the file. The file keeps each
Triton kernel's source, signature and constants, from which the PTX and its access summary are derived again.

Format (``"format": "torch_tessera.KernelProgram"``, ``"version": 1``): the program's fields by name; buffers,
launches and arguments as objects of their fields; launches tagged by ``"kind"`` (``"triton"``/``"extern"``).
Values of open type (scalar arguments, extern args and kwargs, kernel configs and constants) are JSON scalars when
that is exact (``None``, bool, int, str, finite float), else an object tagged by ``"$"``: ``tensor`` (a view),
``dtype``, ``device``, ``layout``, ``memory_format``, ``float`` (inf/nan), ``tuple``, ``list``, ``dict``, ``scalar``
(a :class:`ScalarArg`), and ``repr`` for a value no tag covers (dumped for reading; loading it raises).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import torch

from torch_tessera.errors import ConfigError
from torch_tessera.lowering.program import (Buffer, BufferKind, ExternLaunch, KernelProgram, KernelSource, Provenance,
                                            ScalarArg, TensorArg, TritonLaunch)

FORMAT, VERSION = "torch_tessera.KernelProgram", 1


class ProgramFileError(ConfigError):
    """A program file that is missing, not JSON, or not a program this version can load."""


# -- encode ------------------------------------------------------------------------------------------------------------
def _value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"$": "float", "repr": repr(v)}
    if isinstance(v, TensorArg):
        return {"$": "tensor", **_view(v)}
    if isinstance(v, ScalarArg):
        return {"$": "scalar", "value": _value(v.value)}
    if isinstance(v, torch.dtype):
        return {"$": "dtype", "name": _dtype_name(v)}
    if isinstance(v, torch.device):
        return {"$": "device", "name": str(v)}
    if isinstance(v, torch.layout):
        return {"$": "layout", "name": str(v)}
    if isinstance(v, torch.memory_format):
        return {"$": "memory_format", "name": str(v)}
    if isinstance(v, (tuple, list)):
        return {"$": type(v).__name__, "items": [_value(x) for x in v]}
    if isinstance(v, Mapping):
        return {"$": "dict", "items": [[_value(k), _value(x)] for k, x in v.items()]}
    return {"$": "repr", "type": type(v).__name__, "text": repr(v)}


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _view(t: TensorArg) -> dict:
    return {"buffer": t.buffer, "offset": t.offset, "size": list(t.size), "stride": list(t.stride),
            "dtype": _dtype_name(t.dtype)}


def _provenance(p: Provenance) -> dict:
    return {"aten_ops": list(p.aten_ops), "fx_nodes": list(p.fx_nodes), "module_paths": list(p.module_paths)}


def _launch(launch: TritonLaunch | ExternLaunch) -> dict:
    if isinstance(launch, TritonLaunch):
        return {"kind": "triton", "index": launch.index, "kernel": launch.kernel,
                "param_names": list(launch.param_names), "args": [_value(a) for a in launch.args],
                "grid": list(launch.grid), "config": _value(dict(launch.config)), "mutated": list(launch.mutated),
                "provenance": _provenance(launch.provenance)}
    return {"kind": "extern", "index": launch.index, "op": launch.op, "args": _value(tuple(launch.args)),
            "kwargs": _value(dict(launch.kwargs)), "writes": list(launch.writes),
            "outputs": [_view(t) for t in launch.outputs], "provenance": _provenance(launch.provenance)}


def program_to_json(program: KernelProgram) -> dict:
    """``program`` as JSON data (see the module docstring); :func:`load_program` gives it back, equal field by field."""
    return {
        "format": FORMAT, "version": VERSION, "device": program.device,
        "buffers": [{"name": b.name, "kind": b.kind.value, "dtype": _dtype_name(b.dtype), "nbytes": b.nbytes,
                     "device": b.device, "input_index": b.input_index} for b in program.buffers.values()],
        "inputs": [_value(a) for a in program.inputs],
        "launches": [_launch(launch) for launch in program.launches],
        "outputs": [_value(a) for a in program.outputs],
        "kernels": [{"name": k.name, "source": k.source, "signature": dict(k.signature),
                     "constants": _value(dict(k.constants))} for k in program.kernels.values()],
        "static_inputs": list(program.static_inputs),
    }


def dump_program(program: KernelProgram, path: str | os.PathLike) -> None:
    """Write :func:`program_to_json` of ``program`` to ``path`` (indented JSON)."""
    with open(path, "w") as f:
        json.dump(program_to_json(program), f, indent=1)


def _torch_constant(name: str, kind: type) -> Any:
    """``torch.strided`` from ``"torch.strided"`` (a layout or memory format by its ``str``)."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, kind):
        raise ValueError(f"{name!r} is not a torch {kind.__name__}")
    return value


# -- decode ------------------------------------------------------------------------------------------------------------
class _Decoder:
    """Decodes one file's data; every error names the file and where in it."""

    def __init__(self, origin: str):
        self.origin = origin

    def fail(self, where: str, problem: str) -> ProgramFileError:
        return ProgramFileError(f"{self.origin}: {where}: {problem}")

    def dtype(self, name: Any, where: str) -> torch.dtype:
        d = getattr(torch, name, None) if isinstance(name, str) else None
        if not isinstance(d, torch.dtype):
            raise self.fail(where, f"unknown dtype {name!r}")
        return d

    def view(self, d: Any, where: str) -> TensorArg:
        try:
            return TensorArg(str(d["buffer"]), int(d["offset"]), tuple(int(s) for s in d["size"]),
                             tuple(int(s) for s in d["stride"]), self.dtype(d["dtype"], where))
        except (KeyError, TypeError, ValueError) as e:
            raise self.fail(where, f"not a tensor view ({type(e).__name__}: {e})") from None

    def value(self, v: Any, where: str) -> Any:
        if not isinstance(v, dict):
            if isinstance(v, list):
                raise self.fail(where, "bare JSON list (tuples and lists are tagged objects in this format)")
            return v
        tag = v.get("$")
        named = {"dtype": lambda n: self.dtype(n, where), "device": torch.device,
                 "layout": lambda n: _torch_constant(n, torch.layout),
                 "memory_format": lambda n: _torch_constant(n, torch.memory_format)}
        try:
            if tag == "tensor":
                return self.view(v, where)
            if tag == "scalar":
                return ScalarArg(self.value(v["value"], where))
            if tag in named:
                return named[tag](v["name"])
            if tag == "float":
                return float(v["repr"])
            if tag in ("tuple", "list"):
                items = [self.value(x, f"{where}[{i}]") for i, x in enumerate(v["items"])]
                return tuple(items) if tag == "tuple" else items
            if tag == "dict":
                return {self.value(k, where): self.value(x, f"{where}.{k}") for k, x in v["items"]}
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise self.fail(where, f"malformed {tag!r} value ({type(e).__name__}: {e})") from None
        if tag == "repr":
            raise self.fail(where, f"holds a {v.get('type')} value ({v.get('text')}) that the dump could not "
                                   f"represent; this program cannot be replayed from its file")
        raise self.fail(where, f"unknown value tag {tag!r}")

    def provenance(self, d: Mapping, where: str) -> Provenance:
        return Provenance(tuple(d.get("aten_ops", ())), tuple(d.get("fx_nodes", ())),
                          tuple(d.get("module_paths", ())))

    def launch(self, d: Mapping, i: int) -> TritonLaunch | ExternLaunch:
        where = f"launch {i}"
        prov = self.provenance(d.get("provenance", {}), where)
        if d.get("kind") == "triton":
            return TritonLaunch(int(d["index"]), str(d["kernel"]), tuple(d["param_names"]),
                                tuple(self.value(a, f"{where} arg {j}") for j, a in enumerate(d["args"])),
                                tuple(int(g) for g in d["grid"]), self.value(d["config"], f"{where} config"),
                                tuple(d.get("mutated", ())), prov)
        if d.get("kind") == "extern":
            return ExternLaunch(int(d["index"]), str(d["op"]), self.value(d["args"], f"{where} args"),
                                self.value(d["kwargs"], f"{where} kwargs"), tuple(d["writes"]),
                                tuple(self.view(t, f"{where} output") for t in d.get("outputs", ())), prov)
        raise self.fail(where, f"kind {d.get('kind')!r} is neither 'triton' nor 'extern'")

    def program(self, data: Any) -> KernelProgram:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise self.fail("top level", f"not a torch_tessera program dump (no \"format\": \"{FORMAT}\"); dumps "
                                         "written before the format had a name cannot be loaded: dump again")
        if data.get("version") != VERSION:
            raise self.fail("top level", f"format version {data.get('version')!r}, this torch_tessera reads "
                                         f"version {VERSION}")
        try:
            buffers = {b["name"]: Buffer(b["name"], BufferKind(b["kind"]), self.dtype(b["dtype"], f"buffer "
                                         f"{b['name']}"), int(b["nbytes"]), b["device"], b["input_index"])
                       for b in data["buffers"]}
            launches = tuple(self.launch(d, i) for i, d in enumerate(data["launches"]))
            kernels = {k["name"]: KernelSource(k["name"], k["source"], dict(k["signature"]),
                                               self.value(k["constants"], f"kernel {k['name']} constants"))
                       for k in data["kernels"]}
            return KernelProgram(buffers, tuple(self.value(a, f"input {i}") for i, a in enumerate(data["inputs"])),
                                 launches, tuple(self.value(a, f"output {i}") for i, a in enumerate(data["outputs"])),
                                 kernels, str(data["device"]), tuple(data.get("static_inputs", ())))
        except ProgramFileError:
            raise
        except KeyError as e:
            raise self.fail("program", f"missing field {e}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise self.fail("program", f"malformed ({type(e).__name__}: {e})") from None


def load_program(source: str | os.PathLike | Mapping) -> KernelProgram:
    """The :class:`KernelProgram` of a dump: a ``program_<n>.json`` path, or the data :func:`program_to_json` made.

    Raises:
        ProgramFileError: (a :class:`~torch_tessera.errors.ConfigError`) the file is missing or unreadable, is not
            JSON, or is not a program of this format version; the message names the file and the problem.
    """
    if isinstance(source, Mapping):
        return _Decoder("program data").program(dict(source))
    origin = os.fspath(source)
    try:
        with open(origin) as f:
            data = json.load(f)
    except OSError as e:
        raise ProgramFileError(f"{origin}: cannot read the program file ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProgramFileError(f"{origin}: not JSON ({e})") from None
    return _Decoder(origin).program(data)
