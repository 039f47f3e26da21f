"""Strict JSON for every file and line the package writes (the CLI's ``--out`` files, ``--json`` lines, dumps).

NaN and +/-Infinity are not JSON: ``jq``, JavaScript's ``JSON.parse`` and Python's ``json.loads`` with a strict
``parse_constant`` refuse them. :func:`dumps` writes each of them as ``null``, so a figure that does not exist (an
option that does not fit, a rate with no finished request) reads as null, never as an invalid token.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any, Callable


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +/-inf, numpy's included) replaced by ``None``, through dicts,
    lists and tuples (tuples become lists, as JSON writes them); numpy float scalars become Python floats."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy float32 and the like
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(obj: Any, *, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with non-finite floats written as ``null`` (:func:`finite`).

    Args:
        obj: what to write.
        default: as ``json.dumps``'s (``str`` for objects JSON has no form for); its result is made finite too.
        kwargs: passed to ``json.dumps`` (``indent``, ``sort_keys``...).

    Raises:
        TypeError: an object JSON cannot write and ``default`` does not turn into one.
    """
    hook = None if default is None else (lambda o: finite(default(o)))
    return json.dumps(finite(obj), default=hook, allow_nan=False, **kwargs)


def dump(obj: Any, fp: Any, **kwargs: Any) -> None:
    """:func:`dumps` of ``obj`` written to the open text file ``fp``."""
    fp.write(dumps(obj, **kwargs))
