"""``tessera bench --measure`` on two CPU virtual devices: every plan compiled once, profiled, planned, run, checked.

Timings under the Triton interpreter mean nothing; these tests check the plumbing: a row per plan, every executed
plan equal to eager (serially and with micro-batches), the bound from measured costs above every plan, JSON written.
"""

from __future__ import annotations

import json
import math

import pytest

from torch_tessera.benchmark import plan_names
from torch_tessera.cli import main


def test_measure_on_cpu_virtual_devices(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))  # profile every launch afresh
    rc = main(["bench", "--measure", "--model", "llama", "--size", "tiny", "--devices", "cpu:0,cpu:1",
               "--layers", "1", "--repeats", "1", "--warmup", "0", "--profile-repeats", "1", "--micro-batches", "2",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    result = json.loads((tmp_path / "bench.json").read_text())["measured"]
    rows = {r["plan"]: r for r in result["rows"]}
    assert list(rows) == list(plan_names(2))
    meta = result["meta"]
    assert meta["layers"] == 1 and meta["timings_meaningful"] is False
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in meta["measured_kernel_seconds"].values())
    ran = [r for r in rows.values() if r["how"].startswith("run")]
    assert {r["plan"] for r in ran} >= {"homo-L", "homo-R", "tessera"}
    assert all(r["equal"] is True and r["prefill_s"] > 0 and r["decode_s"] > 0 for r in ran)
    assert any(r["cut_edges"] > 0 and not math.isnan(r["decode_pipelined_s"]) for r in ran)  # a split plan pipelined
    bound = meta["zero_communication_bound_output_per_s"]
    for r in rows.values():
        if r["applies"]:
            assert 0 < r["output_per_s"] < math.inf, r  # CPU timings: positive, not compared (noise under load)
    for r in ran:
        # each executed plan's model over the same measured costs cannot beat the free-transfer plan on them by more
        # than that plan's MILP stopping gap (plan()'s default mip_gap, 0.5 %)
        assert 0 < r["predicted_output_per_s"] <= bound * 1.005, r
    homos = rows["homo-L"]["output_per_s"] + rows["homo-R"]["output_per_s"]
    assert rows["request-dist"]["output_per_s"] == pytest.approx(homos)
    assert rows["pd"]["how"].startswith("derived")
    assert "MEASURED" in out and (tmp_path / "bench.png").stat().st_size > 0


def test_measure_rejects_a_model_without_kv_cache(capsys):
    assert main(["bench", "--measure", "--model", "mamba", "--size", "tiny", "--devices", "cpu:0,cpu:1"]) == 2
    assert "static KV cache" in capsys.readouterr().err


def test_measure_rejects_simulated_devices(capsys):
    assert main(["bench", "--measure", "--model", "llama", "--size", "tiny", "--devices", "cpu:0,sim:l40s"]) == 2
    err = capsys.readouterr().err
    assert "sim:l40s is simulated" in err and "cuda:N@Ksm" in err
