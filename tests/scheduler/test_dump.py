"""Every MILP a plan solves can be written as MPS and replayed; the plan itself as JSON (``dump_dir``)."""

from __future__ import annotations

import json

import pytest

from conftest import random_costs, random_dag, topo
from torch_tessera.scheduler import plan


@pytest.mark.parametrize("policy", ["throughput", "latency"])
def test_plan_writes_its_milps_and_itself(tmp_path, policy):
    from scipy.optimize._highspy import _core

    dag = random_dag(10, 3)
    costs, tp = random_costs(dag, 2, 3), topo(2)
    result = plan(dag, costs, tp, policy=policy, tie_layers=False, dump_dir=tmp_path)
    mps = sorted(tmp_path.glob("milp_*.mps"))
    assert mps, f"no MILP written (solver method {result.solver.method})"
    for path in mps:
        text = path.read_text()
        assert text.startswith("NAME") and "ROWS" in text and "ENDATA" in text and "'INTORG'" in text
        h = _core._Highs()
        h.setOptionValue("output_flag", False)
        assert h.readModel(str(path)) != _core.HighsStatus.kError
        assert h.getNumCol() > 0 and h.getNumRow() > 0
        h.run()
        assert h.getModelStatus() == _core.HighsModelStatus.kOptimal  # the replayed model is complete and solvable
    dumped = json.loads((tmp_path / f"plan_{policy}_0.json").read_text())
    assert dumped["policy"] == policy and dumped["predicted_seconds"] == pytest.approx(result.predicted_seconds)
    (name, placement), = result.placements.items()
    assert {int(k): v for k, v in dumped["placements"][name].items()} == dict(placement)


def test_no_dump_without_dump_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dag = random_dag(6, 0)
    plan(dag, random_costs(dag, 2, 0), topo(2), tie_layers=False, cache_dir=False)
    assert not list(tmp_path.rglob("*.mps"))
