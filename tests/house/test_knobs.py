"""torch_tessera.knobs is the one reader of our environment variables, and it reads them at call time."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torch_tessera import knobs
from torch_tessera.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[2] / "torch_tessera"


def _env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, variable)`` of every ``os.environ[...]``, ``os.environ.get(...)``/``setdefault``/``pop`` and
    ``os.getenv(...)`` whose variable is a string constant starting with ``TESSERA_``."""
    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
            (isinstance(node, ast.Name) and node.id == "environ")

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault", "pop") and is_environ(f.value):
                key = node.args[0]
            elif (isinstance(f, ast.Attribute) and f.attr == "getenv") or (isinstance(f, ast.Name) and f.id == "getenv"):
                key = node.args[0]
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            key = node.left  # "TESSERA_X" in os.environ
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("TESSERA_"):
            found.append((node.lineno, key.value))
    return found


def test_only_knobs_reads_tessera_variables():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "knobs.py" and path.parent == PACKAGE:
            continue
        for line, name in _env_reads(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} reads {name}")
    assert offenders == [], "read these through torch_tessera.knobs:\n" + "\n".join(offenders)


def test_the_check_sees_each_way_of_reading():
    src = ('import os\nfrom os import environ, getenv\na = os.environ["TESSERA_A"]\nb = os.environ.get("TESSERA_B")\n'
           'c = os.getenv("TESSERA_C")\nd = getenv("TESSERA_D")\ne = environ.get("TESSERA_E")\n'
           'f = "TESSERA_F" in os.environ\ng = os.environ.get("HOME")\n')
    assert [n for _, n in _env_reads(ast.parse(src))] == [f"TESSERA_{c}" for c in "ABCDEF"]


def test_every_knob_is_documented_in_the_module_table():
    for k in knobs.KNOBS:
        assert k.name.startswith("TESSERA_") and k.doc
        assert f"``{k.name}``" in knobs.__doc__


def test_cache_dir_is_read_at_call_time(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "one"))
    assert knobs.cache_dir() == tmp_path / "one"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "two"))
    assert knobs.cache_dir("plans") == tmp_path / "two" / "plans"


def test_cache_dir_default_is_under_home(tmp_path, monkeypatch):
    monkeypatch.delenv("TESSERA_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert knobs.cache_dir() == tmp_path / ".cache" / "torch_tessera"
    monkeypatch.setenv("TESSERA_CACHE_DIR", "")  # empty counts as unset
    assert knobs.cache_dir("ptx") == tmp_path / ".cache" / "torch_tessera" / "ptx"


def test_every_cache_follows_the_knob(tmp_path, monkeypatch):
    from torch_tessera.ptx.compile import cache_dir as ptx_dir
    from torch_tessera.scheduler.cache import default_dir as plan_dir
    from torch_tessera.target.profiler import cache_dir as profile_dir

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert (ptx_dir(), plan_dir(), profile_dir()) == (tmp_path / "ptx", tmp_path / "plans", tmp_path / "profiles")
    assert profile_dir(tmp_path / "mine") == tmp_path / "mine" / "profiles"


@pytest.mark.parametrize("kind,raw,value", [(int, "7", 7), (float, "2.5", 2.5), (bool, "Yes", True),
                                            (bool, "off", False), (str, "x", "x")])
def test_knob_converts_its_type(monkeypatch, kind, raw, value):
    monkeypatch.setenv("TESSERA_TEST_KNOB", raw)
    assert knobs.Knob("TESSERA_TEST_KNOB", kind, None, "a test knob").get() == value


@pytest.mark.parametrize("kind,raw", [(int, "seven"), (bool, "maybe"), (float, "1,5")])
def test_bad_value_names_the_variable(monkeypatch, kind, raw):
    monkeypatch.setenv("TESSERA_TEST_KNOB", raw)
    with pytest.raises(ConfigError, match=f"TESSERA_TEST_KNOB={raw!r}"):
        knobs.Knob("TESSERA_TEST_KNOB", kind, None, "a test knob").get()
