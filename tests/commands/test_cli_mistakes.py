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
    (SYNTH + ["--memory", "1"], "option --memory='1' gives 1 budget(s) for 2 devices (big, small): give one per "
                                "device of --devices"),
    (["plan", "--synthetic-layers", "2", "--devices", "sim:a100,sim:l40s"],
     "option --devices='sim:a100,sim:l40s': --synthetic-layers plans on the synthetic devices big, mid, small, not "
     "sim:a100, sim:l40s; e.g. --devices big,small"),
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


@pytest.mark.parametrize("argv, fix", [
    (["bench", "--measure", "--model", "llama", "--devices", "cuda:9,cuda:8"],
     "On this one, --devices cpu:0,cpu:1 runs the same measurement on two CPU virtual devices"),
    (["census", "--model", "llama", "--devices", "cuda:9,cuda:8"],
     "Without --measure the census is predicted: name the GPUs from the catalog as sim:NAME"),
    (["census", "--model", "llama", "--devices", "cuda:9,cuda:8", "--measure"], "or leave out --measure"),
    (["serve-bench", "--engine", "real", "--devices", "cuda:9,cuda:8", "--rates", "1", "--out", "OUT"],
     "--devices cpu:0,cpu:1 --size tiny runs it on two CPU virtual devices, and --engine sim"),
    (["devices", "--devices", "cuda:9"], "add --assume-gpu h200"),
], ids=["bench-measure", "census", "census-measure", "serve-bench-real", "devices"])
def test_missing_gpu_gives_the_fix_of_the_command(argv, fix, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    line = err.splitlines()[-1]
    assert "Traceback" not in err and line.startswith(f"tessera {argv[0]}: error: cuda:9 is not present: "), err
    assert fix in line, line
    if argv[0] != "devices":  # `tessera devices --assume-gpu` describes a GPU; it does not run or measure one
        assert "--assume-gpu" not in line, line


def test_negative_numbers_are_values():
    assert _join_negative_values(["serve-bench", "--rates", "-1,2", "-v"]) == ["serve-bench", "--rates=-1,2", "-v"]
    assert _join_negative_values(["--seed", "-3"]) == ["--seed=-3"]
    assert _join_negative_values(["--rates=1", "-v"]) == ["--rates=1", "-v"]


def test_unknown_model_fails_before_lowering_and_lists_the_aliases(capsys):
    assert main(["plan", "--model", "llamma", "--devices", "sim:a100,sim:l40s", "--no-cache"]) == 2
    out, err = capsys.readouterr()
    assert out == "", out  # no "lowering llamma ..." promise before the failure
    assert "unknown model 'llamma'. Did you mean 'llama'?" in err, err
    assert "llama-3.1-8b (= llama)" in err and "mixtral-8x7b (= moe)" in err, err


def test_infeasible_memory_names_the_memory_option(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(SYNTH + ["--memory", "1,1", "--gantt", ""])
    out = capsys.readouterr().out
    assert "device big needs" in out and "Fix: raise --memory (now 1,1 GB), add a device to --devices" in out, out
    assert "memory_budgets" not in out, out


def test_devices_help_names_the_synthetic_devices():
    from torch_tessera.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")  # noqa: SLF001 - argparse's subparsers
    text = " ".join(sub.choices["plan"].format_help().split())
    assert "with --synthetic-layers the synthetic devices big, mid, small, e.g. big,small" in text, text


def test_memory_budgets_take_the_units_of_a_device_string():
    from torch_tessera.commands.plan import _gigabytes

    assert _gigabytes("40GB,512MB") == [40.0, 0.512]
    assert _gigabytes("80,48") == [80.0, 48.0]
    assert abs(_gigabytes("1GiB")[0] - 1.073741824) < 1e-12
