"""Every JSON file or line the CLI writes is strict JSON: NaN and infinities are written as null (torch_tessera.jsonout),
never as the bare tokens NaN/Infinity that jq, JavaScript and strict parsers refuse."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

from torch_tessera import jsonout

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "torch_tessera"
#: Modules that write JSON for the CLI: every command, the launch-times files, the plan dumps.
WRITERS = sorted((PACKAGE_ROOT / "commands").glob("*.py")) + [PACKAGE_ROOT / "measure" / "kernel_times.py",
                                                              PACKAGE_ROOT / "scheduler" / "__init__.py"]


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("path", WRITERS, ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_json_is_written_through_jsonout(path):
    calls = [f"line {n.lineno}: json.{n.func.attr}" for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("dump", "dumps")
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "json"]
    assert not calls, f"{path.name} writes JSON without torch_tessera.jsonout (NaN would be written): {calls}"


def test_non_finite_values_become_null_everywhere():
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5, (np.float32("nan"), np.float64(2.0))],
             "c": np.float32(0.5), "d": 3, "e": None, "f": "NaN", "g": True}
    text = jsonout.dumps(value, indent=1)
    assert _strict(text) == {"a": None, "b": [None, None, 1.5, [None, 2.0]], "c": 0.5, "d": 3, "e": None,
                             "f": "NaN", "g": True}


def test_default_results_are_made_finite_too():
    class Odd:
        pass

    assert _strict(jsonout.dumps({"x": Odd()}, default=lambda o: math.nan)) == {"x": None}
    with pytest.raises(TypeError):
        jsonout.dumps({"x": Odd()})
