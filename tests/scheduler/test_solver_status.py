"""The throughput solve's status names a MIP gap only for a plan a MILP found."""

from __future__ import annotations

from torch_tessera.scheduler.solve import throughput_status


def test_heuristic_plan_within_the_gap_does_not_mention_a_mip_gap():
    assert throughput_status("heft", 0.003, 5e-3, "optimal") == "within 0.3 % of the bound"
    assert throughput_status("counts-lp+local", 0.004, 5e-3, "optimal") == "within 0.4 % of the bound"
    assert "mip" not in throughput_status("heft+local", 0.002, 5e-3, "optimal")


def test_milp_plan_within_the_gap_names_it_and_other_statuses_stay():
    assert throughput_status("counts-milp+local", 0.003, 5e-3, "optimal") == "within mip_gap 0.005"
    assert throughput_status("heft", 0.0, 5e-3, "optimal") == "optimal"
    assert throughput_status("milp", 0.2, 5e-3, "time limit") == "time limit"
    assert throughput_status("heft", 0.2, 5e-3, "optimal") == "feasible"


def test_a_fitting_baseline_is_the_plan_when_the_solver_finds_none_in_time(monkeypatch, caplog):
    import pytest

    import torch_tessera.scheduler as scheduler
    from torch_tessera.backend.workload import model_workload
    from torch_tessera.commands.advise import pair_specs
    from torch_tessera.errors import InfeasiblePlanError

    mw = model_workload("llama", pair_specs(("a100", "a100")), size="tiny").on_devices(
        pair_specs(("a100", "h100"), ",mem=60MB"))  # neither GPU holds a whole copy; the layer split fits

    def no_placement(pb, *args):
        raise InfeasiblePlanError("no feasible placement: no feasible placement found within time_limit=1 s")

    monkeypatch.setattr(scheduler, "solve_throughput", no_placement)
    layer = scheduler.plan(mw.workload, None, mw.topology, policy="layer", cache_dir=False)
    with caplog.at_level("WARNING", logger="torch_tessera"):
        got = scheduler.plan(mw.workload, None, mw.topology, policy="throughput", cache_dir=False)
    assert got.placements == layer.placements and "fallback" in got.solver.method
    assert "the solver found no placement within time_limit=" in caplog.text
    small = mw.on_devices(pair_specs(("a100", "h100"), ",mem=20MB"))  # no baseline fits: the solver's error stands
    with pytest.raises(InfeasiblePlanError, match="no feasible placement found"):
        scheduler.plan(small.workload, None, small.topology, policy="throughput", cache_dir=False)
