"""tessera plan's throughput plan is chosen from a space holding every baseline's placement, ranked by the simulated
step (the planner's own score): never simulated slower than a baseline (on big + small the planner's single placement
alone is far below request-dist)."""

import argparse

from torch_tessera.cli import main
from torch_tessera.commands.plan import PLANNER, _synthetic_inputs, best_throughput, plan_all, step_seconds
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
    best_baseline = min(step_seconds(p) for p in baselines.values())
    assert step_seconds(planner) > best_baseline  # the case this guards: the single placement alone is behind
    chosen, note = best_throughput(plans, wl, topo, micro_batches=2)
    assert step_seconds(chosen["throughput"]) <= best_baseline * (1 + 1e-9)
    assert chosen[PLANNER] is planner and ("request stream" in note or "request-dist" in note)
    for k, p in baselines.items():
        assert chosen[k] is p  # the baselines themselves are unchanged


def test_planner_placement_stays_when_it_is_best():
    plans, wl, topo = _plans("big,small")
    best = min((p for p in plans.values() if isinstance(p, Plan)), key=step_seconds)
    only = {"throughput": best, "homo-L": plans["homo-L"]}
    chosen, note = best_throughput(only, wl, topo, micro_batches=2)
    assert step_seconds(chosen["throughput"]) <= step_seconds(best) * (1 + 1e-9)
    if chosen["throughput"] is best:
        assert note == "" and PLANNER not in chosen


def test_plan_command_prints_the_chosen_throughput_plan(tmp_path, capsys):
    assert main(["plan", "--synthetic-layers", "2", "--devices", "big,small", "--no-cache",
                 "--gantt", str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    steps = _steps(out)
    assert steps["throughput"] <= steps["request-dist"] + 1e-3 and PLANNER in steps
    assert "throughput plan:" in out and (tmp_path / "g.png").exists()


def _steps(out: str) -> dict[str, float]:
    """Each plan's simulated step in ms from ``tessera plan``'s comparison table (its cycle when not simulated)."""
    table = out[out.index("cycle/step"):].splitlines()[2:]  # the comparison table, below its header and rule
    unit = {"s": 1e3, "ms": 1.0, "us": 1e-3}
    steps = {}
    for v in (line.split() for line in table):
        if len(v) > 5 and v[2] in unit:  # name, cycle, unit, speed-up, simulated, unit (or "-")
            steps[v[0]] = float(v[4]) * unit[v[5]] if v[4] != "-" else float(v[1]) * unit[v[2]]
    return steps


def test_two_identical_gpus_show_the_planners_simulated_step_beside_the_best_baseline(capsys):
    """On two H200s the planner's single placement cannot replicate the model as request-dist does: the throughput
    plan is chosen by the simulated step, and the note puts the planner's placement beside the best baseline."""
    assert main(["plan", "--model", "llama", "--size", "tiny", "--devices", "cuda:0,cuda:1", "--no-cache",
                 "--gantt", ""]) == 0
    out = capsys.readouterr().out
    steps = _steps(out)
    baselines = {k: v for k, v in steps.items() if k in ("homo-L", "homo-R", "request-dist", "pd", "af", "layer")}
    assert steps["throughput"] <= min(baselines.values()) + 1e-6
    line = next(x for x in out.splitlines() if x.startswith(f"{PLANNER} (the planner's single placement): simulated"))
    best = min(baselines, key=baselines.get)
    assert f"{baselines[best] / steps[PLANNER]:.2f}x the best baseline, {best} (" in line, line


def test_a_cut_placements_cycle_is_explained_by_the_per_cut_charge():
    """A placement that cuts at every attention (af's, taken as the planner's): its cycle carries the cycle model's
    per-cut charge, about twice its simulated step; the note says how much of it, and what the simulator charges."""
    from torch_tessera.commands.plan import _model_inputs

    args = argparse.Namespace(model="llama", size="tiny", devices="cuda:0,cuda:1", output_tokens=129.0)
    wl, topo, model = _model_inputs(args)
    plans = plan_all(wl, None, topo, "throughput", True, micro_batches=2, time_limit=5.0, cache_dir=False,
                     pipeline=model)
    af = plans["af"]
    assert af.cycle_seconds > 1.5 * af.simulated_seconds  # the disagreement this explains
    chosen, note = best_throughput({**plans, "throughput": af}, wl, topo, micro_batches=2)
    assert chosen[PLANNER] is af and step_seconds(chosen["throughput"]) < step_seconds(af)
    line = note.splitlines()[-1]
    busiest = max(range(2), key=lambda g: af.device_seconds[g])
    assert line.startswith(f"{PLANNER} (the planner's single placement): simulated {af.simulated_seconds * 1e3:.4g} "
                           "ms/step, "), line
    assert (f"Its cycle/step, {af.cycle_seconds * 1e3:.4g} ms, is {af.cycle_seconds / af.simulated_seconds:.2f}x that: "
            f"{af.hop_seconds[busiest] * 1e3:.4g} ms of it on {af.devices[busiest]} is the cycle model's per-cut "
            "charge (52 us per cut edge per micro-batch") in line, line
    assert f"over its {len(af.cut_edges)} cut edges, where the simulator charges a 0.63 us wait and the link." in line


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
