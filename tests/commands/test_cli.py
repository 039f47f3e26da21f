"""The command line: the main job on small sizes, plan, inspect, and errors a user can cause."""

from __future__ import annotations

import json

import pytest
import torch

from torch_tessera.cli import main


def test_bench_checks_every_plan_and_predicts(tmp_path, capsys):
    rc = main(["bench", "--size", "tiny", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    result = json.loads((tmp_path / "bench.json").read_text())
    check = {r["plan"]: r for r in result["check"]}
    assert set(check) == {"homo-L", "homo-R", "af", "layer", "tessera", "latency"}
    assert all(r["equal"] for r in check.values())
    assert all(r["transfers"] == r["cut_edges"] for r in check.values())
    assert check["af"]["cut_edges"] > 0  # attention on one device, the rest on the other
    sim = {r["plan"]: r for r in result["simulated"]["rows"]}
    assert set(sim) - {"tessera-single"} == {"homo-L", "homo-R", "request-dist", "pd", "af", "layer", "tessera"}
    # tessera's space contains every baseline's placement, request-dist's request streams included (issue 21): it is
    # never behind any of them; when a baseline wins, the planner's own plan stays beside it as tessera-single
    best_baseline = max(r["output_per_s"] for n, r in sim.items()
                        if n not in ("tessera", "tessera-single") and r["applies"])
    assert sim["tessera"]["output_per_s"] >= best_baseline * (1 - 1e-9)
    # by default the space holds one request stream per device too, scored beside every applicable baseline
    meta = result["simulated"]["meta"]
    assert set(meta["tessera_space"]) == {"tessera", "streams"} | {n for n, r in sim.items()
                                                                   if r["applies"] and n not in ("tessera",
                                                                                                 "tessera-single")}
    assert ("tessera-single" in sim) == (meta["tessera_from"] != "tessera")
    if "tessera-single" in sim:
        assert sim["tessera-single"]["output_per_s"] <= sim["tessera"]["output_per_s"]
    assert meta["tessera_choice"] in out and "one request stream per device" in meta["tessera_choice"]
    assert all(r["vs_bound"] <= 1 + 1e-9 for r in sim.values() if r["applies"])  # the bound bounds them
    # memory: GB per device under a header naming the devices, not Python tuples; the JSON keeps the numbers
    assert "memory per device (sim:a100 | sim:l40s)" in out, out
    line = next(l for l in out.split("PREDICTED")[1].splitlines() if l.startswith("tessera "))
    cells = " | ".join(f"{gb:>6.2f} GB" for gb in sim["tessera"]["memory_gb"])
    assert line.endswith(cells) and "(" not in line, line
    assert all(isinstance(gb, float) for gb in sim["tessera"]["memory_gb"])
    assert "sim:a100 " in out.split("memory per device, GB = weights + STATE (KV caches) + activations:")[1], out


def test_bench_streams_is_the_default_and_no_streams_leaves_them_out(tmp_path, capsys):
    import argparse

    from torch_tessera.commands.bench import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).streams and parser.parse_args(["--streams"]).streams  # kept for old command lines
    assert parser.parse_args(["--no-streams"]).streams is False
    rc = main(["bench", "--size", "tiny", "--no-check", "--no-streams", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    sim = json.loads((tmp_path / "bench.json").read_text())["simulated"]
    rows = {r["plan"]: r for r in sim["rows"]}
    assert "streams" not in sim["meta"]["tessera_space"] and sim["meta"]["tessera_from"] != "streams"
    assert "one request stream per device: not a candidate" in out
    best = max(r["output_per_s"] for n, r in rows.items() if n not in ("tessera", "tessera-single") and r["applies"])
    assert rows["tessera"]["output_per_s"] >= best * (1 - 1e-9)  # request-dist's placement is still in the space
    assert "PREDICTED" in out and (tmp_path / "bench.png").stat().st_size > 0


def test_plan_model_tiny_writes_gantt(tmp_path, capsys):
    png = tmp_path / "plan.png"
    rc = main(["plan", "--model", "llama", "--size", "tiny", "--devices", "sim:a100,sim:l40s", "--no-cache",
               "--gantt", str(png)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Plan 'throughput'" in out and "layer" in out and png.stat().st_size > 0


def test_plan_writes_its_gantt_under_the_default_out_dir(tmp_path, monkeypatch, capsys):
    """Without --gantt the chart goes where every command writes its files (tessera_out/), not the working
    directory's top level."""
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--synthetic-layers", "2", "--devices", "big,small", "--no-baselines", "--no-cache"]) == 0
    capsys.readouterr()
    assert (tmp_path / "tessera_out" / "tessera_plan.png").stat().st_size > 0
    assert not (tmp_path / "tessera_plan.png").exists()


FOUR_H200 = "cuda:0,cuda:1,cuda:2@72sm,cuda:3@72sm"  # issue 7's machine; planned here for an assumed H200


def test_bench_and_plan_on_four_devices(tmp_path, capsys):
    rc = main(["bench", "--size", "tiny", "--no-check", "--streams", "--devices", FOUR_H200, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    sim = {r["plan"]: r for r in json.loads((tmp_path / "bench.json").read_text())["simulated"]["rows"]}
    assert set(sim) - {"tessera-single"} == {"homo-0", "homo-1", "homo-2", "homo-3", "request-dist", "pd", "af",
                                              "layer", "tessera"}
    assert all(sim[f"homo-{i}"]["applies"] for i in range(4))
    # tessera is the best of one placement (tessera-single when it loses), one request stream per device and every
    # baseline's placement: it is never behind a baseline (--streams: the default, kept for old command lines)
    best = max(r["output_per_s"] for n, r in sim.items() if n not in ("tessera", "tessera-single") and r["applies"])
    assert sim["tessera"]["output_per_s"] >= best * (1 - 1e-9)
    if "tessera-single" in sim:
        assert sim["tessera"]["output_per_s"] >= sim["tessera-single"]["output_per_s"]
    # the partitions are priced at their SM share of a whole H200
    prices = json.loads((tmp_path / "bench.json").read_text())["simulated"]["meta"]["prices"]
    assert prices["cuda:2@72sm"][0] == pytest.approx(prices["cuda:0"][0] * 72 / 132)
    png = tmp_path / "plan4.png"
    rc = main(["plan", "--model", "llama", "--size", "tiny", "--devices", FOUR_H200, "--no-cache", "--gantt", str(png)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "homo-3" in out and png.stat().st_size > 0


def test_unknown_model_lists_registry(capsys):
    assert main(["bench", "--model", "lama", "--no-check", "--no-simulate"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'lama'" in err and "llama" in err and "mamba" in err


def test_bad_device_string_shows_forms(capsys):
    assert main(["plan", "--model", "llama", "--size", "tiny", "--devices", "gpu0,sim:l40s"]) == 2
    err = capsys.readouterr().err
    assert "gpu0" in err and "cuda:N" in err


@pytest.mark.parametrize("model", ["mlp"])
def test_inspect(model, capsys):
    assert main(["inspect", "--model", model]) == 0
    out = capsys.readouterr().out
    assert "extern" in out and "triton" in out and "equals eager" in out


def test_unknown_option_is_reported_with_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--frobnicate"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "tessera bench: error: unrecognized arguments: --frobnicate" in err and "--measure" in err


@pytest.mark.parametrize("argv, what", [
    (["plan", "--model", "llama"], "tessera plan: error: the following arguments are required: --devices"),
    (["plan", "--model", "llama", "--devices", "cpu:0", "--size", "huge"], "invalid choice: 'huge'"),
    (["bogus"], "tessera: error: argument COMMAND: invalid choice: 'bogus'"),
], ids=["missing-required", "bad-choice", "unknown-command"])
def test_usage_mistakes_print_one_line_and_exit_2(argv, what, capsys):
    """An ordinary mistake is one line on stderr naming it and the help to read, not argparse's usage block."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and what in err and "--help'" in err and "usage:" not in err, err


def test_bench_chart_marks_tessera_not_the_last_bar():
    from torch_tessera.commands.bench import bar_colors

    colors = bar_colors(["homo-L", "request-dist", "tessera", "tessera-single"])
    assert colors[2] != colors[3] and colors.count(colors[2]) == 1


def test_bench_memory_note_names_the_parts_and_the_extra_state():
    from torch_tessera.benchmark import SimRow
    from torch_tessera.commands.bench import memory_note

    def row(name, state):
        return SimRow(name, True, "", 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, tuple(16.0 + s + 1.0 for s in state),
                      (16.0, 16.0), tuple(state), (1.0, 1.0))

    devices = ("sim:a100", "sim:l40s")
    note = memory_note([row("request-dist", (9.0, 9.0)), row("tessera", (14.5, 18.0))], devices)
    lines = note.splitlines()
    assert lines[0] == "memory per device, GB = weights + STATE (KV caches) + activations:"
    assert lines[1] == ("  tessera       sim:a100 31.50 GB = weights 16.00 + STATE 14.50 + activations 1.00; "
                        "sim:l40s 35.00 GB = weights 16.00 + STATE 18.00 + activations 1.00"), lines[1]
    assert lines[2].startswith("  request-dist  sim:a100 26.00 GB = weights 16.00 + STATE 9.00 + activations 1.00; ")
    assert "holds more STATE" in lines[3]
    assert "holds more STATE" not in memory_note([row("request-dist", (9.0, 9.0)), row("tessera", (9.0, 9.0))],
                                                 devices)


@pytest.mark.skipif(torch.cuda.is_available(), reason="says what a machine without the GPUs does")
def test_bench_and_plan_say_a_missing_gpu_is_planned_as_an_h200(tmp_path, capsys):
    from torch_tessera.target.devices import assumed_note, parse_devices

    assert main(["bench", "--model", "llama", "--devices", "cuda:0,cuda:1@24sm", "--no-check",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "note: cuda:0, cuda:1 not present on this machine (0 CUDA GPU(s)): planning each as an H200" in out, out[:2000]
    assert assumed_note(parse_devices("cpu:0,sim:a100")) is None
