"""``tessera report`` over the saved GPU runs under docs/results: each report's output equals the Markdown saved
beside those runs when they were first reported (``readme_table.md``, ``streams_report.md``, ``gap_*.md``,
``check_step_model.md``), and bad input is refused with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torch_tessera.cli import main

ROOT = Path(__file__).resolve().parents[2]
S8 = "docs/results/2026-11-30-s8"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the saved reports name runs by their paths from the repository root


def _out(capsys, *argv: str) -> str:
    assert main(["report", *argv]) == 0
    return capsys.readouterr().out


def _saved(name: str) -> str:
    return (ROOT / name).read_text()


def test_table_reproduces_the_saved_table(capsys):
    runs = [f"{S8}/3/l24s", f"{S8}/3/l72s", *(f"{S8}/2/{r}" for r in ("m24s", "m72s", "d24s", "d72s"))]
    assert _out(capsys, "table", *runs) == _saved(f"{S8}/readme_table.md")
    single = _out(capsys, "table", "--single", *runs)
    head = single.splitlines()[0]
    assert "tessera-single" not in head and head.endswith("| tessera | bound | tessera % of bound | tessera vs "
                                                          "baselines | target met? |")
    # the single placement's number is now in the tessera column (llama at 24 SMs: 6,598 tok/s)
    assert single.splitlines()[2].split(" | ")[9] == "6,598"


def test_streams_reproduces_the_saved_report(capsys):
    runs = [f"{S8}/1/{r}" for r in ("d24", "d24s", "d72s", "m24s")] + \
        [f"{S8}/2/{r}" for r in ("d24s", "d72s", "m24s", "m72s")] + [f"{S8}/3/{r}" for r in ("l24s", "l72s")]
    assert _out(capsys, "streams", *runs) == _saved(f"{S8}/streams_report.md")


def test_streams_values_derive_from_the_saved_json(capsys):
    """The MMDiT run at 72 SMs: request-dist executed against the homo-* sum, tessera on request-dist's placement,
    each stream's thread; the figures recomputed here from the bench.json."""
    run = ROOT / S8 / "2/d72s"
    out = _out(capsys, "streams", str(run))
    m = json.loads((run / "bench.json").read_text())["measured"]
    rows, meta = {r["plan"]: r for r in m["rows"]}, m["meta"]
    homo_sum = 60 * (rows["homo-L"]["output_per_s"] + rows["homo-R"]["output_per_s"])  # images/min, each run alone
    ratio = rows["request-dist"]["output_per_s"] / (homo_sum / 60)
    assert f"the homo-* runs alone sum to {homo_sum:,.1f}: ratio {ratio:.3f}" in out
    same = meta["plans"]["tessera"]["placements"] == meta["plans"]["request-dist"]["placements"]
    assert same and "same placement as request-dist: True" in out
    th, alone = meta["runs"]["request-dist"]["concurrent_threads"]["denoise@1"], \
        meta["runs"]["request-dist"]["seconds"]["denoise@1"]
    assert f"| denoise@1 | 0.377 | {th['calls']} | {th['seconds']:.4f} | {1e3 * th['seconds'] / th['calls']:.2f} | " \
           f"{1e3 * alone:.2f} |" in out
    assert f"'input': {meta['runs']['homo-R']['bytes_per_call']['denoise']['input']}" in out


def test_streams_goes_on_past_a_run_it_cannot_read(capsys):
    assert main(["report", "streams", "no/such/run", f"{S8}/2/d72s"]) == 2
    cap = capsys.readouterr()
    assert "no/such/run: no bench.json there" in cap.err and "denoise@1" in cap.out


@pytest.mark.parametrize("run", ["2/d24s", "2/m72s", "3/l24s"])
def test_gaps_reproduce_the_saved_breakdowns(capsys, run):
    out = _out(capsys, "gaps", f"{S8}/{run}/bench.json", "tessera", "request-dist")
    assert out == _saved(f"{S8}/gap_{run.split('/')[1]}.md")


def test_gaps_name_the_plans_a_run_has(capsys):
    assert main(["report", "gaps", "docs/results/2026-11-30-s7/5/d24"]) == 2  # default plans: tessera-single, layer
    err = capsys.readouterr().err
    assert "no executed plan tessera-single" in err and "plans of this run: homo-L, homo-R" in err
    assert main(["report", "gaps", "docs/results/2026-11-29-s3/c/llama24"]) == 2
    assert "saved no kernel_seconds" in capsys.readouterr().err


def test_step_model_reproduces_the_saved_check(capsys):
    out = _out(capsys, "step-model", "docs/results/2026-11-30-s5", "docs/results/2026-11-30-s7")
    assert out == _saved("docs/results/2026-11-30-s7/check_step_model.md")
    # the same runs named from elsewhere: grouped by their dated results directory still
    os.chdir(ROOT / "docs")
    again = _out(capsys, "step-model", str(ROOT / "docs/results/2026-11-30-s7"))
    assert "| 2026-11-30-s7 | 32 |" in again and "| results/2026-11-30-s7/5/d24 |" in again


def test_bad_input_is_refused_with_the_reason(tmp_path, capsys):
    (tmp_path / "bench.json").write_text(json.dumps({"predicted": {}}))
    assert main(["report", "table", str(tmp_path)]) == 2
    assert "no 'measured' section" in capsys.readouterr().err
    (tmp_path / "bench.json").write_text("{not json")
    assert main(["report", "table", str(tmp_path)]) == 2
    assert "not readable as JSON" in capsys.readouterr().err
    assert main(["report", "step-model", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["report", "streams", "--single", f"{S8}/2/d72s"]) == 2
    assert "--single applies to `tessera report table` only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "tabel", f"{S8}/2/d72s"])
    assert "invalid choice: 'tabel'" in capsys.readouterr().err
