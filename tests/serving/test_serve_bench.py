"""``tessera serve-bench`` with the simulated engine."""

from __future__ import annotations

import argparse
import json

import pytest

from torch_tessera.commands import serve_bench as command
from torch_tessera.errors import ConfigError, DeviceUnavailableError


def run(capsys, *argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    code = command.run(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def _cost_file(tmp_path):
    fast = {"prefill_s_per_token": 1e-6, "decode_base_s": 1e-3, "decode_s_per_seq": 1e-5}
    slow = {"prefill_s_per_token": 1e-4, "decode_base_s": 0.1, "decode_s_per_seq": 0.0}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"source": "test figures", "policies": {
        "fast": {"plans": {"main": fast}}, "slow": {"plans": {"main": slow}},
        "tessera": {"plans": {"latency": fast, "throughput": {**fast, "decode_s_by_bucket": {"8": 5e-4}}}}}}))
    return path


def _sweep(capsys, tmp_path, out):
    return run(capsys, "--rates", "4,2", "--sim-costs", str(_cost_file(tmp_path)), "--requests", "30",
               "--input-len", "64", "--output-len", "8", "--buckets", "1,2,4,8", "--out", str(out))


def test_sweep_prints_writes_json_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    code, text = _sweep(capsys, tmp_path, out)
    assert code == 0
    assert "test figures" in text and "Highest swept rate meeting the SLO" in text
    assert text.startswith("serve-bench: SIMULATED: model"), text[:200]  # the simulated engine says so on screen
    report = json.loads((out / "serve_bench.json").read_text())
    assert {(p["policy"], p["rate"]) for p in report["points"]} == {
        (n, r) for n in ("fast", "slow", "tessera") for r in (2.0, 4.0)}
    by = {(p["policy"], p["rate"]): p for p in report["points"]}
    # slow: 7 decode steps of 100 ms for 8 tokens, >= 87.5 ms/token, over the 50 ms/token SLO; fast: ~1 ms per token
    assert not by["slow", 2.0]["slo_met"] and by["slow", 2.0]["norm_latency_mean_s"] >= 0.0875
    assert by["fast", 4.0]["slo_met"] and by["fast", 4.0]["norm_latency_mean_s"] < 0.005
    assert report["highest_swept_rate"] == {"fast": 4.0, "slow": None, "tessera": 4.0}
    assert all(p["requests"] == 30 for p in report["points"])
    assert (out / "latency_vs_rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    row = next(l for l in text.splitlines() if l.startswith("2 ") and " slow " in l)
    assert row.rstrip().endswith("NO")
    # complete: serve_bench.json holds every point and the per-point file is gone
    assert not (out / "serve_bench.partial.jsonl").exists()


def test_a_run_stopped_part_way_keeps_every_point_it_measured(tmp_path, capsys, monkeypatch):
    """Each point is appended to serve_bench.partial.jsonl as it is measured (a real sweep runs for minutes): a run
    stopped before its report keeps them all, in the order of the complete run's report."""
    assert _sweep(capsys, tmp_path, tmp_path / "full")[0] == 0
    done = json.loads((tmp_path / "full" / "serve_bench.json").read_text())

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "format_table", stop)  # first called after the last point is measured
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _sweep(capsys, tmp_path, out)
    lines = [json.loads(x) for x in (out / "serve_bench.partial.jsonl").read_text().splitlines()]
    assert [(p["policy"], p["rate"]) for p in lines] == [(p["policy"], p["rate"]) for p in done["points"]]
    assert not (out / "serve_bench.json").exists()


def test_trace_lengths_and_policy_filter(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_tokens": 10, "output_tokens": 3}\n{"input_tokens": 20, "output_tokens": 5}\n')
    code, _ = run(capsys, "--rates", "1", "--sim-costs", str(_cost_file(tmp_path)), "--policies", "fast",
                  "--trace", str(trace), "--requests", "4", "--out", str(tmp_path / "o"))
    assert code == 0
    (point,) = json.loads((tmp_path / "o" / "serve_bench.json").read_text())["points"]
    assert point["policy"] == "fast" and point["requests"] == 4
    assert point["throughput_tok_s"] * point["duration_s"] == pytest.approx(3 + 5 + 3 + 5)


def test_bad_options_name_the_fix(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"known: \['fast', 'slow', 'tessera'\]"):
        run(capsys, "--rates", "1", "--sim-costs", str(_cost_file(tmp_path)), "--policies", "pd")
    with pytest.raises(ConfigError, match="numbers separated by commas"):
        run(capsys, "--rates", "1,x")
    with pytest.raises(DeviceUnavailableError, match="cuda:0"):  # the real engine's default devices, here on CPU
        run(capsys, "--rates", "1", "--engine", "real", "--requests", "2", "--out", str(tmp_path / "r"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"policies": {"x": {"plans": {"main": {"decode_base": 1}}}}}')
    with pytest.raises(ConfigError, match="unknown fields"):
        run(capsys, "--rates", "1", "--sim-costs", str(bad))


def test_real_engine_report_keeps_each_plan(tmp_path, capsys):
    """The real engine on two CPU devices: serve_bench.json says, per policy and plan, what was planned (the cut
    edges and launches per device of each program), so a GPU run's plans can be read afterwards."""
    code, text = run(capsys, "--rates", "50", "--engine", "real", "--size", "tiny", "--layers", "1", "--devices",
                  "cpu:0,cpu:1", "--policies", "homo-L,tessera", "--requests", "2", "--input-len", "6",
                  "--output-len", "3", "--buckets", "2", "--out", str(tmp_path / "r"))  # 1 layer: the report's keys
    assert code == 0 and "SIMULATED" not in text.splitlines()[0]
    report = json.loads((tmp_path / "r" / "serve_bench.json").read_text())
    assert set(report["plans"]) == {"homo-L/main", "tessera/latency", "tessera/throughput"}
    home = report["plans"]["homo-L/main"]
    assert set(home) == {"2", "prefill"}
    assert home["prefill"]["cut_edges"] == 0 and home["prefill"]["launches_per_device"][1] == 0
    assert home["prefill"]["launches_per_device"][0] > 0
    assert report["plans"]["tessera/latency"]["2"]["objective"] == "latency"
    assert report["plans"]["tessera/throughput"]["2"]["objective"] == "cycle"


def test_default_out_is_tessera_out_as_every_command(tmp_path, capsys, monkeypatch):
    """Without --out the results go to tessera_out/ in the working directory, as bench's, census's, pairs' and
    advise's do (not a serve_bench/ directory of its own); --out still names another (the tests above)."""
    from torch_tessera.cli import build_parser
    from torch_tessera.outpaths import DEFAULT_OUT_DIR

    sub = next(a for a in build_parser()._actions if a.dest == "command")  # noqa: SLF001 - argparse's subparsers
    outs = {name: next(a.default for a in p._actions if a.dest == "out")  # noqa: SLF001
            for name, p in sub.choices.items() if any(a.dest == "out" for a in p._actions)}  # noqa: SLF001
    assert DEFAULT_OUT_DIR == "tessera_out"
    assert {n: d for n, d in outs.items() if n != "calibrate"} == {
        n: DEFAULT_OUT_DIR for n in ("bench", "serve-bench", "census", "pairs", "advise")}, outs
    monkeypatch.chdir(tmp_path)
    code, _ = run(capsys, "--rates", "2", "--sim-costs", str(_cost_file(tmp_path)), "--requests", "4",
                  "--input-len", "16", "--output-len", "2", "--buckets", "1,2")
    assert code == 0
    assert (tmp_path / "tessera_out" / "serve_bench.json").exists() and not (tmp_path / "serve_bench").exists()
