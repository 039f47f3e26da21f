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
