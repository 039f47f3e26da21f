"""The backend's options, parsed once into a frozen, strict config."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Mapping

from torch_tessera.errors import ConfigError

FALLBACKS = ("inductor", "raise")


@dataclass(frozen=True)
class TesseraConfig:
    """Options of ``torch.compile(..., backend="tessera", options={...})``.

    Attributes:
        fallback: what to do when a graph cannot be lowered: ``"inductor"`` (default) logs one warning on the
            ``torch_tessera`` logger and compiles the graph with plain Inductor; ``"raise"`` re-raises the error.
        dump_dir: when set, every stage writes its artifacts there (``program_<n>.json``, one ``.py`` per kernel).
    """

    fallback: str = "inductor"
    dump_dir: str | None = None

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ConfigError(f"option fallback={self.fallback!r} is not one of {FALLBACKS}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None, mode: str | None = None) -> "TesseraConfig":
        """Parse ``torch.compile`` options. Unknown keys raise :class:`ConfigError` listing the valid ones.

        Args:
            options: the ``options`` dict given to ``torch.compile``, or None.
            mode: the ``mode`` given to ``torch.compile``; only ``None`` and ``"default"`` are accepted for now.
        """
        if mode not in (None, "default"):
            raise ConfigError(f"mode={mode!r} is not supported by the tessera backend; leave mode unset")
        options = dict(options or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        for key in options:
            if key not in valid:
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown tessera option {key!r}.{hint} Valid options: {', '.join(valid)}")
        return cls(**options)
