"""Reports over saved ``tessera bench --measure`` runs (their ``bench.json``), for ``tessera report``.

Each report reads JSON only and returns Markdown lines; :mod:`torch_tessera.commands.report` prints them.

* :mod:`.table`: one row per run, every plan's throughput, the zero-communication bound and the targets checked;
* :mod:`.streams`: how the request-stream plans executed (each stream's thread against its calls alone);
* :mod:`.gaps`: where a plan's measured step goes against its model, per device and per program;
* :mod:`.step_model`: the step model (cycle, fill/drain) against the measured steps, and the concurrent call counts.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch_tessera.errors import ConfigError


def bench_json(path: str | Path) -> Path:
    """The ``bench.json`` that ``path`` names: the file itself, or the one in the ``--out`` directory ``path``.

    Raises:
        ConfigError: nothing readable there.
    """
    p = Path(path)
    p = p / "bench.json" if p.is_dir() else p
    if not p.is_file():
        raise ConfigError(f"{path}: no bench.json there (pass the --out directory of `tessera bench --measure`, or "
                          f"its bench.json)")
    return p


def load_run(path: str | Path) -> dict:
    """The whole content of one measured run's ``bench.json`` (see :func:`bench_json`).

    Raises:
        ConfigError: no such file, not JSON, or no ``measured`` section (not a ``tessera bench --measure`` output).
    """
    p = bench_json(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{p}: not readable as JSON ({e})") from e
    if not isinstance(data, dict) or "measured" not in data:
        raise ConfigError(f"{p}: no 'measured' section (not a `tessera bench --measure` output)")
    return with_nan(data)


def with_nan(data: dict) -> dict:
    """``data`` (a ``bench.json``) with each measured row's float field written as null (a NaN: the CLI writes strict
    JSON, :mod:`torch_tessera.jsonout`) NaN again, as :class:`~torch_tessera.measure.rows.MeasuredRow` holds it."""
    import dataclasses
    import math

    from torch_tessera.measure.rows import MeasuredRow

    floats = [f.name for f in dataclasses.fields(MeasuredRow) if f.type in ("float", float)]
    for row in data.get("measured", {}).get("rows", []):
        for k in floats:
            if k in row and row[k] is None:
                row[k] = math.nan
    return data
