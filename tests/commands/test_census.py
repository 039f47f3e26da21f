"""tessera census: shares of launches faster on each device, their share of time, the paper's figures beside."""

import json

import numpy as np
import pytest

from torch_tessera.cli import main
from torch_tessera.commands.census import PAPER_MEAN, census_rows, format_rows, paper_figures
from torch_tessera.target.devices import parse_devices


def test_rows_count_launches_and_time_weighted_by_runs_per_step():
    # prefill: 2 launches, one faster on the second device; decode (runs 3x per step): 1 launch, faster there
    prefill = np.array([[1.0, 2.0], [3.0, 1.0]])
    decode = np.array([[2.0, 1.0]])
    rows = census_rows([("prefill", 1.0, prefill, ["gemm", "norm"]), ("decode", 3.0, decode, ["gemm"])],
                       {"all": (67.0, 36.0), "prefill": (45.0, None)})
    by = {(r.program, r.op_class): r for r in rows}
    assert by["prefill", "all"].faster_on_second == pytest.approx(50.0)
    assert by["prefill", "all"].time_share == pytest.approx(75.0)
    assert by["prefill", "all"].paper_faster == 45.0
    assert by["prefill", "gemm"].faster_on_second == 0.0 and by["prefill", "norm"].time_share == 100.0
    whole = by["all", "all"]  # 1 + 1 + 3 launches; 4 of 5 faster; A time 1 + 3 + 6 = 10, faster 3 + 6
    assert whole.launches == 5 and whole.faster_on_second == pytest.approx(80.0)
    assert whole.time_share == pytest.approx(90.0) and whole.paper_time == 36.0
    assert "SIMULATED" in format_rows(rows, ["sim:a100", "sim:l40s"], measured=False)


def test_paper_figures_only_for_the_papers_pair_with_the_mean_where_none():
    a100_l40s = parse_devices("sim:a100,sim:l40s")
    assert paper_figures("llama", a100_l40s)["all"] == (PAPER_MEAN[0], 26.3)
    assert paper_figures("mlp", a100_l40s)["all"] == PAPER_MEAN
    assert paper_figures("moe", a100_l40s)["decode"] == (57.0, None)
    assert paper_figures("llama", parse_devices("sim:h100,sim:rtxpro6000")) == {}


def test_census_command_writes_table_json_and_png(tmp_path, capsys):
    assert main(["census", "--model", "mlp", "--size", "tiny", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "67.0 %" in out and "--size tiny (the tiny model" in out
    data = json.loads((tmp_path / "census_mlp_tiny.json").read_text())
    assert data["label"] == "SIMULATED" and data["size"] == "tiny" and data["rows"][0]["program"]
    assert (tmp_path / "census_mlp_tiny.png").stat().st_size > 10_000
    assert not (tmp_path / "census_mlp.json").exists()  # a full-size census in the same folder is not overwritten


def test_census_refuses_a_prompt_of_no_tokens(capsys):
    assert main(["census", "--model", "mlp", "--size", "tiny", "--prefill-tokens", "0"]) == 2
    assert "--prefill-tokens must be at least 1" in capsys.readouterr().err


def test_census_refuses_other_than_two_devices(capsys):
    assert main(["census", "--model", "mlp", "--size", "tiny", "--devices", "sim:a100"]) == 2
    assert "exactly two devices" in capsys.readouterr().err


def test_png_panels_count_launches_as_the_table_does():
    """The PNG's whole-workload panel weights each launch by its program's runs per step, as the rows do: its share
    of launches faster on the second device is the table's (80 %, not the 67 % of counting each program once)."""
    from torch_tessera.commands.census import histogram_panels, panel_share

    tables = [("prefill", 1.0, np.array([[1.0, 2.0], [3.0, 1.0]]), ["gemm", "norm"]),
              ("decode", 3.0, np.array([[2.0, 1.0]]), ["gemm"])]
    rows = {(r.program, r.op_class): r for r in census_rows(tables)}
    panels = {name: (w, sec) for name, w, sec in histogram_panels(tables)}
    assert set(panels) == {"prefill", "decode", "all"}
    for name, (w, sec) in panels.items():
        assert panel_share(w, sec) == pytest.approx(rows[name, "all"].faster_on_second)
        assert w.sum() == pytest.approx(rows[name, "all"].launches)
    assert panel_share(*panels["all"]) == pytest.approx(80.0)


def test_a_full_size_ssm_census_names_its_long_lowering_and_the_quick_option():
    from torch_tessera.commands.census import scan_unroll_notice

    note = scan_unroll_notice("ssm", "full", 1024)
    assert note is not None and "1024 tokens" in note and "--prefill-tokens 32" in note
    assert scan_unroll_notice("ssm", "full", 32) is None
    assert scan_unroll_notice("ssm", "tiny", 1024) is None
    assert scan_unroll_notice("llm", "full", 1024) is None
