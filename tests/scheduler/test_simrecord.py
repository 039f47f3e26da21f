"""The offline re-simulation record (``scheduler/simrecord``): schedules written losslessly (the form of
``pipeline_schedule.schedule_to_data``), and the older lossy records (session 13's GPU files) still read and simulate
as the same schedule would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import random_schedules
from torch_tessera.errors import ConfigError
from torch_tessera.scheduler.pipeline_schedule import (PipelinedSchedule, RecordStep, RunStep, TransferStep, WaitStep,
                                                       schedule_to_data)
from torch_tessera.scheduler.simrecord import (costs_to_json, links_to_json, memory_to_json, resimulate,
                                               schedule_from_json, schedule_to_json)
from torch_tessera.scheduler.synthetic import nvlink_topology

#: session 13's GPU call 4: Llama's plans, written in the lossy form with their costs
CALL4 = Path(__file__).resolve().parents[2] / "docs/results/2026-12-02-s13/call4/cd/cut_diagnose.json"


def _lossy(s: PipelinedSchedule) -> dict:
    """``s`` in the older lossy form, written here independently of the module (what session 13's bench wrote)."""
    streams = []
    for st in s.streams:
        out = []
        for x in st:
            if isinstance(x, RunStep):
                out.append(["run", x.micro_batch, x.launch])
            elif isinstance(x, TransferStep):
                out.append(["transfer", x.micro_batch, x.src, x.dst, x.nbytes, x.purpose])
            elif isinstance(x, RecordStep):
                out.append(["record", x.micro_batch, x.event_id])
            else:
                out.append(["wait", x.micro_batch, x.event_id])
        streams.append(out)
    return {"devices": s.devices, "micro_batches": s.micro_batches, "domains": list(s.domains),
            "placement": {str(k): v for k, v in s.placement.items()}, "cut_edges": [list(e) for e in s.cut_edges],
            "source": s.source, "streams": streams}


def _inputs(costs) -> dict:
    return json.loads(json.dumps({"costs": costs_to_json(costs), "links": links_to_json(nvlink_topology(["a", "b"])),
                                  "memory": memory_to_json(None), "wait_seconds": 1e-6}))


def test_record_is_lossless():
    """Every schedule comes back equal through JSON: transfers with their byte ranges, waits with their edges."""
    kinds = set()
    for _, _, s in random_schedules(5):
        record = json.loads(json.dumps(schedule_to_json(s)))
        assert record == json.loads(json.dumps(schedule_to_data(s)))
        back = schedule_from_json(record)
        assert back == s and back.streams == s.streams
        kinds |= {type(x) for x in s.steps()}
    assert kinds >= {RunStep, RecordStep, WaitStep, TransferStep}  # every kind was exercised


def test_lossy_record_still_reads_and_simulates_the_same():
    """The older form reads back with the same steps (transfers without ranges, waits without edges) and simulates
    to the same step time as the schedule itself."""
    seen = 0
    for _, costs, s in random_schedules(7):
        back = schedule_from_json(json.loads(json.dumps(_lossy(s))))
        assert [[type(x) for x in st] for st in back.streams] == [[type(x) for x in st] for st in s.streams]
        for a, b in zip(back.steps(), s.steps()):
            if isinstance(b, TransferStep):
                assert (a.src, a.dst, a.micro_batch, a.nbytes, a.purpose) == (b.src, b.dst, b.micro_batch, b.nbytes,
                                                                              b.purpose)
                seen += 1
            elif isinstance(b, (RecordStep, WaitStep)):
                assert (a.device, a.micro_batch, a.event_id) == (b.device, b.micro_batch, b.event_id)
            else:
                assert a == b
        assert back.placement == s.placement and back.cut_edges == s.cut_edges
        inputs = _inputs(costs)
        assert resimulate(_lossy(s), inputs) == resimulate(schedule_to_json(s), inputs)
    assert seen  # some schedules moved bytes


@pytest.mark.skipif(not CALL4.is_file(), reason="session 13's call-4 record is not in this checkout")
def test_session13_call4_file_resimulates():
    """Session 13's GPU file (lossy form) still reads; each plan simulates as its schedule rewritten losslessly."""
    res = json.loads(CALL4.read_text())
    m = res["models"]["llama"]
    assert m["plans"]
    for name, r in m["plans"].items():
        old = r["schedule"]
        assert isinstance(old["placement"], dict)  # the file really is in the old form
        s = schedule_from_json(old)
        assert sum(len(st) for st in s.streams) == sum(len(st) for st in old["streams"]) > 0
        got = resimulate(old, m["sim_inputs"])
        assert got > 0 and got == resimulate(schedule_to_json(s), m["sim_inputs"]), name


def test_bad_records_name_the_problem():
    _, _, s = next(random_schedules(3))
    lossy = _lossy(s)
    lossy["streams"][0][0] = ["launch", 0, 0]
    with pytest.raises(ConfigError, match="kind 'launch'"):
        schedule_from_json(lossy)
    record = schedule_to_json(s)
    for bad in (["X", 0, 0, 0], ["R", 0, 0]):
        with pytest.raises(ConfigError, match="not a step"):
            schedule_from_json({**record, "streams": [[bad]]})
    with pytest.raises(ConfigError, match="KeyError"):
        schedule_from_json({k: v for k, v in record.items() if k != "domains"})
