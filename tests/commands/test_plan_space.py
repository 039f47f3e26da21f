"""tessera plan's throughput plan is chosen from a space holding every baseline's placement: never predicted below a
baseline (on big + small the planner's single placement alone is far below request-dist)."""

import argparse

from torch_tessera.cli import main
from torch_tessera.commands.plan import PLANNER, _synthetic_inputs, best_throughput, plan_all
from torch_tessera.scheduler import Plan


def _plans(devices):
    args = argparse.Namespace(devices=devices, synthetic_layers=2, output_tokens=129.0)
    wl, topo, model = _synthetic_inputs(args)
    plans = plan_all(wl, None, topo, "throughput", True, micro_batches=2, time_limit=5.0, cache_dir=False,
                     pipeline=model)
    return plans, wl, topo


def test_throughput_plan_is_never_below_a_baseline():
    plans, wl, topo = _plans("big,small")
    baselines = {k: p for k, p in plans.items() if k not in ("throughput", "latency") and isinstance(p, Plan)}
    planner = plans["throughput"]
    best_baseline = max(p.throughput_per_s for p in baselines.values())
    assert planner.throughput_per_s < best_baseline  # the case this guards: the single placement alone is behind
    chosen, note = best_throughput(plans, wl, topo, micro_batches=2)
    assert chosen["throughput"].throughput_per_s >= best_baseline * (1 - 1e-9)
    assert chosen[PLANNER] is planner and ("request stream" in note or "request-dist" in note)
    for k, p in baselines.items():
        assert chosen[k] is p  # the baselines themselves are unchanged


def test_planner_placement_stays_when_it_is_best():
    plans, wl, topo = _plans("big,small")
    best = max((p for p in plans.values() if isinstance(p, Plan)), key=lambda p: p.throughput_per_s)
    only = {"throughput": best, "homo-L": plans["homo-L"]}
    chosen, note = best_throughput(only, wl, topo, micro_batches=2)
    assert chosen["throughput"].throughput_per_s >= best.throughput_per_s * (1 - 1e-9)
    if chosen["throughput"] is best:
        assert note == "" and PLANNER not in chosen


def test_plan_command_prints_the_chosen_throughput_plan(tmp_path, capsys):
    assert main(["plan", "--synthetic-layers", "2", "--devices", "big,small", "--no-cache",
                 "--gantt", str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    table = out[out.index("cycle/step"):].splitlines()[2:]  # the comparison table, below its header and rule
    cycle = {v[0]: float(v[1]) for v in (line.split() for line in table) if len(v) > 2 and v[2] == "ms"}
    assert cycle["throughput"] <= cycle["request-dist"] + 1e-3 and PLANNER in cycle
    assert "throughput plan:" in out and (tmp_path / "g.png").exists()


def test_plan_command_prints_the_simulated_step_and_draws_the_plans_own_schedule(tmp_path, capsys, monkeypatch):
    """``tessera plan`` prints the chosen plan's simulated step and its schedule, and the Gantt chart simulates the
    schedule the plan carries (the very object), not one built again."""
    import torch_tessera.commands.plan as plan_cmd
    from torch_tessera.scheduler import pipeline_plan

    drawn, given = [], []
    real_sim, real_gantt = pipeline_plan.simulate_program, plan_cmd.write_gantt

    def spy_sim(pb, p, prog, schedule, *args, **kwargs):
        drawn.append(schedule)
        return real_sim(pb, p, prog, schedule, *args, **kwargs)

    def spy_gantt(chosen, *args, **kwargs):
        given.append(chosen)
        drawn.clear()
        return real_gantt(chosen, *args, **kwargs)

    monkeypatch.setattr(pipeline_plan, "simulate_program", spy_sim)
    monkeypatch.setattr(plan_cmd, "write_gantt", spy_gantt)
    assert main(["plan", "--synthetic-layers", "2", "--devices", "big,small", "--no-cache",
                 "--gantt", str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    assert "simulated step (pipelined schedule" in out and "its schedule per pipeline step:" in out
    (chosen,) = given
    assert chosen.schedules and len(drawn) == 1
    assert any(drawn[0] is s for _, s in chosen.schedules)
    assert (tmp_path / "g.png").stat().st_size > 1000
