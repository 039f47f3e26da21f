"""Option ``costs``: plans from measured launch times on CPU virtual devices (Triton's interpreter), the profile and
plan caches across processes, the cost model when asked, and caches that cannot be used."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import torch_tessera
from torch_tessera.backend.config import TesseraConfig
from torch_tessera.errors import ConfigError, TesseraCacheWarning

DEVICES = "cpu:0,cpu:1"


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))


def _compile_and_check(costs: str) -> torch_tessera.backend.explain.GraphReport:
    """Compile the MLP on two CPU devices with ``costs``, assert it equals eager, return explain's one report."""
    torch._dynamo.reset()
    m, x = _mlp(), torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", options={"devices": DEVICES, "costs": costs}, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    (report,) = torch_tessera.explain(f)
    assert report.backend == "tessera", report.reason
    return report


def test_costs_option_lists_the_valid_values():
    assert TesseraConfig.from_options({"costs": "measured"}).costs == "measured"
    assert TesseraConfig().costs == "auto"
    with pytest.raises(ConfigError, match=r"option costs='measure' is not one of \('auto', 'model', 'measured'\)\. "
                                          r"Did you mean 'measured'\?"):
        TesseraConfig.from_options({"costs": "measure"})
    with pytest.raises(ConfigError, match=r"option costs=1 is not one of \('auto', 'model', 'measured'\)"):
        TesseraConfig.from_options({"costs": 1})


def test_measured_costs_profile_each_distinct_launch_and_equal_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    report = _compile_and_check("measured")
    assert report.costs.startswith(f"measured on cpu:0, cpu:1: 3 launches")
    assert report.launches_timed >= 1  # an empty cache: something was timed now
    assert f"{report.launches_timed} timed now" in report.costs
    assert len(list((tmp_path / "profiles").glob("*.json"))) >= 1
    assert "costs: measured on cpu:0, cpu:1" in report.plan  # the plan's summary names its costs
    assert "reused from the plan cache" not in report.plan_source
    assert "costs measured on cpu:0, cpu:1" in str(torch_tessera.explain())


_CHILD = textwrap.dedent("""
    import json, sys, torch, torch_tessera
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    x = torch.randn(4, 16)
    f = torch.compile(m, backend="tessera", options={"devices": "cpu:0,cpu:1", "costs": "measured"}, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    (report,) = torch_tessera.explain(f)
    print("REPORT " + json.dumps(report.to_jsonable()))
""")


def _child(cache: Path) -> dict:
    env = {**os.environ, "TESSERA_CACHE_DIR": str(cache), "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT ")]
    return json.loads(line[len("REPORT "):])


def test_a_new_process_reuses_the_profiles_and_the_plan(tmp_path):
    first = _child(tmp_path)
    assert first["backend"] == "tessera" and first["launches_timed"] >= 1
    assert first["plan_source"].startswith("solved now by ")
    entries = {p: p.stat().st_mtime_ns for p in (tmp_path / "profiles").glob("*.json")}
    plans = list((tmp_path / "plans").glob("*.json"))
    assert entries and len(plans) == 1

    second = _child(tmp_path)
    assert second["launches_timed"] == 0 and ", 0 timed now," in second["costs"]
    assert second["plan_source"].startswith("reused from the plan cache")
    assert second["launches"] == first["launches"] and second["cut_edges"] == first["cut_edges"]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "profiles").glob("*.json")} == entries  # nothing rewritten
    assert list((tmp_path / "plans").glob("*.json")) == plans


@pytest.mark.parametrize("costs", ["model", "auto"])  # auto on CPU devices: the model
def test_model_costs_never_profile(tmp_path, monkeypatch, costs):
    import torch_tessera.runtime.profiling as profiling

    def refuse(*args, **kwargs):
        raise AssertionError("costs=%r must not profile" % costs)

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profiling, "profile_launches", refuse)
    report = _compile_and_check(costs)
    assert report.costs.startswith("model: roofline model") and report.launches_timed == 0
    assert "costs: model: roofline model" in report.plan
    assert not (tmp_path / "profiles").exists()


def test_an_unwritable_cache_warns_and_plans_in_memory(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("a file where the cache directory should be")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(not_a_dir))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        report = _compile_and_check("measured")
    messages = [str(w.message) for w in got if issubclass(w.category, TesseraCacheWarning)]
    assert any(f"the profile cache {not_a_dir / 'profiles'} cannot be written" in m and "TESSERA_CACHE_DIR" in m
               for m in messages), messages
    assert report.costs.startswith("measured on cpu:0, cpu:1") and report.launches_timed >= 1


def test_a_corrupt_profile_entry_is_ignored_with_a_log_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    _compile_and_check("measured")
    entries = sorted((tmp_path / "profiles").glob("*.json"))
    entries[0].write_text("{not json")
    for other in entries[1:]:
        other.write_text(json.dumps({"seconds": [1.0]}))
    with caplog.at_level(logging.WARNING, logger="torch_tessera"):
        report = _compile_and_check("measured")
    assert f"ignoring unreadable profile cache entry {entries[0]}" in caplog.text
    assert report.launches_timed >= len(entries)  # every corrupt entry was timed again
    assert json.loads(entries[0].read_text())["seconds"] >= 0  # and rewritten


def test_a_launch_failing_while_measured_plans_with_the_model_after_a_warning(tmp_path, monkeypatch):
    import torch_tessera.runtime.profiling as profiling

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profiling, "profile_launches", out_of_memory)
    with pytest.warns(torch_tessera.TesseraFallbackWarning, match=r"could not measure kernel costs on cpu:0, cpu:1 "
                      r"\(OutOfMemoryError: CUDA out of memory.*\); it plans with the cost model instead\. Pass "
                      r"options=\{'costs': 'model'\}"):
        report = _compile_and_check("measured")
    assert report.costs.startswith("model (measuring failed: OutOfMemoryError") and report.launches_timed == 0
    assert "costs from the model (measuring failed: OutOfMemoryError" in report.line(), report.line()
    assert "; roofline model" in report.line(), report.line()


def test_measured_costs_log_counts_and_say_which_device_shares_times(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="torch_tessera"):
        report = _compile_and_check("measured")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("costs: cpu:")]
    # an empty cache: cpu:0 times its 2 distinct launches (3 launches: the two Linears are alike); cpu:1 (same profile identity) reads them all back
    assert lines == [f"costs: cpu:0: 2 of 2 distinct launches to time, 0 from the profile cache {tmp_path / 'profiles'}",
                     f"costs: cpu:1: 0 of 2 distinct launches to time, 2 from the profile cache {tmp_path / 'profiles'}"
                     ], lines
    assert "2 timed now, 2 from the profile cache (cpu:1 shares cpu:0's times)" in report.costs, report.costs
