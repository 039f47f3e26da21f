"""The environment variables torch_tessera reads: the one place that reads them.

Each :class:`Knob` names one variable, its type, its default and its meaning; :meth:`Knob.get` reads the environment
at call time, so a change (or a test's ``monkeypatch.setenv``) takes effect on the next call. No other module of
torch_tessera reads a ``TESSERA_*`` variable (``tests/house/test_knobs.py`` checks that).

Variables that belong to other tools stay with the code that uses them: ``TRITON_INTERPRET`` (Triton's interpreter
switch, :mod:`torch_tessera.compat.triton`) and torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*``
(:mod:`torch_tessera.runtime.distributed`).

| variable | type | default | meaning |
| --- | --- | --- | --- |
| ``TESSERA_CACHE_DIR`` | path | ``~/.cache/torch_tessera`` | root of the on-disk caches: ``programs/``, ``codegen/``, ``warm/``, ``ptx/``, ``plans/``, ``profiles/`` |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_tessera.errors import ConfigError


@dataclass(frozen=True)
class Knob:
    """One environment variable of ours.

    Attributes:
        name: the variable's name, ``TESSERA_...``.
        type: ``str``, ``int``, ``float``, ``bool`` or ``Path``; the raw text is converted with it (``bool``: one
            of ``1/0/true/false/yes/no/on/off``, any case).
        default: the value when the variable is unset or empty; a callable is called at read time (a default that
            depends on the environment, such as the home directory).
        doc: what the variable controls, with its unit.
    """

    name: str
    type: type
    default: Any
    doc: str

    def get(self) -> Any:
        """The variable's value now, converted to :attr:`type`, or :attr:`default` when unset or empty.

        Raises:
            ConfigError: the text does not convert to :attr:`type`; the message names the variable and the value.
        """
        raw = os.environ.get(self.name, "")
        if raw == "":
            return self.default() if callable(self.default) else self.default
        try:
            return _convert(raw, self.type)
        except ValueError:
            raise ConfigError(f"environment variable {self.name}={raw!r} is not a valid {self.type.__name__}: "
                              f"{self.doc}; unset it or give a {self.type.__name__}") from None


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _convert(raw: str, kind: type) -> Any:
    if kind is bool:
        low = raw.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(raw)
    if kind is Path:
        return Path(raw).expanduser()
    return kind(raw)


def _home_cache() -> Path:
    return Path.home() / ".cache" / "torch_tessera"


CACHE_DIR = Knob("TESSERA_CACHE_DIR", Path, _home_cache,
                 "root directory of torch_tessera's on-disk caches (subdirectories programs/, codegen/, warm/, ptx/, "
                 "plans/, profiles/)")

#: Every knob, in the order of the table above.
KNOBS: tuple[Knob, ...] = (CACHE_DIR,)


def cache_dir(sub: str | None = None) -> Path:
    """The cache root (``$TESSERA_CACHE_DIR``, default ``~/.cache/torch_tessera``), or its subdirectory ``sub``.

    Not created here: the cache that writes into it creates it.
    """
    root = CACHE_DIR.get()
    return root / sub if sub else root


def describe() -> dict[str, Any]:
    """``{name: current value}`` of every knob (for logs and bug reports)."""
    return {k.name: k.get() for k in KNOBS}


__all__ = ["CACHE_DIR", "KNOBS", "Knob", "cache_dir", "describe"]
