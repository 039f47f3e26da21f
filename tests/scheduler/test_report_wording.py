"""The plan texts a user reads: whole run counts per program (request streams as shares, not fractions), and a
speed-up legend that names the plan it compares against."""

from __future__ import annotations

import functools

from torch_tessera.scheduler import plan
from torch_tessera.scheduler.report import compare, programs_line
from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

plan = functools.partial(plan, score="cycle", cache_dir=False)


def test_programs_line_gives_whole_runs_and_stream_shares():
    assert programs_line({"prefill": 1.0, "decode": 129.0}) == "runs per step: prefill 1, decode 129"
    assert programs_line({"main": 0.675037, "main@1": 0.324963}) == (
        "runs per step: main 1; requests split over 2 streams (stream 0 67.5 %, stream 1 32.5 %)")
    two = {"prefill": 0.6, "decode": 77.4, "prefill@1": 0.4, "decode@1": 51.6}
    assert programs_line(two) == (
        "runs per step: prefill 1, decode 129; requests split over 2 streams (stream 0 60.0 %, stream 1 40.0 %)")
    assert programs_line({"main": 0.5}) == "runs per step: main 0.5"
    assert programs_line({"a@b": 2.0}) == "runs per step: a@b 2"


def test_summary_and_compare_read_as_a_user_expects():
    dag = transformer_dag(layers=2, tokens=64, context=512)
    devs = ("big", "small")
    costs, topology = roofline_costs(dag, devs), nvlink_topology(devs)
    best, homo = plan(dag, costs, topology), plan(dag, costs, topology, policy="homo-L")
    first = str(best).splitlines()[0]
    assert "runs per step: " in first and " x" not in first.split("runs per step: ")[1], first
    text = compare({"throughput": best, "homo-L": homo}, reference="homo-L")
    assert "speed-up: steps per second relative to homo-L (its cycle/step divided by the plan's;" in text, text
    assert "over homo-L's" not in text and "throughput over" not in text, text
