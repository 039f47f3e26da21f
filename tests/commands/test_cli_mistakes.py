"""Ordinary CLI mistakes print one line and exit 2, never a traceback."""

from __future__ import annotations

import pytest

from torch_tessera.cli import _join_negative_values, main

SYNTH = ["plan", "--synthetic-layers", "2", "--devices", "big,small", "--no-baselines", "--no-cache"]


@pytest.mark.parametrize("argv, message", [
    (SYNTH + ["--gantt", "/proc/x/a.png"], "option --gantt='/proc/x/a.png': cannot create its directory '/proc/x'"),
    (SYNTH + ["--gantt", "/tmp"], "option --gantt='/tmp' is a directory; give a file name"),
    (SYNTH + ["--memory", "abc"], "option --memory='abc' must be budgets in GB separated by commas"),
    (SYNTH + ["--memory", "80,-1"], "option --memory='80,-1': every budget must be a positive number of GB"),
    (["serve-bench", "--rates", "1", "--out", "/proc/x"], "option --out='/proc/x': cannot create the directory"),
    (["serve-bench", "--rates", "-1,2", "--out", "OUT"], "--rates='-1,2': every value must be positive"),
])
def test_mistake_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"tessera {argv[0]}: error: ") and message in err, err


def test_negative_numbers_are_values():
    assert _join_negative_values(["serve-bench", "--rates", "-1,2", "-v"]) == ["serve-bench", "--rates=-1,2", "-v"]
    assert _join_negative_values(["--seed", "-3"]) == ["--seed=-3"]
    assert _join_negative_values(["--rates=1", "-v"]) == ["--rates=1", "-v"]
