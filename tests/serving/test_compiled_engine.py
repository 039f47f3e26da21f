"""The compiled engine on two CPU virtual devices (Triton interpreter, tiny Llama, 1 layer): the serving loop's
requests complete exactly once with eager greedy tokens, with and without plan switches mid-run."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import TEST_DEVICE  # noqa: F401  (sets TRITON_INTERPRET on CPU)
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from torch_tessera.errors import ConfigError, UnsupportedModelError
from torch_tessera.serving.clock import WallClock
from torch_tessera.serving.compiled_engine import CompiledEngine, CompiledModel, EngineSettings
from torch_tessera.serving.loop import ServeConfig, serve
from torch_tessera.serving.monitor import MonitorConfig, PlanMonitor
from torch_tessera.serving.workload import make_requests, with_poisson_arrivals

BUCKETS = (1, 2)
OUTPUT = 4


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if TEST_DEVICE != "cpu":
        pytest.skip("CPU virtual devices only")
    import os

    os.environ["TESSERA_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    torch._dynamo.reset()
    s = EngineSettings(devices="cpu:0,cpu:1", buckets=BUCKETS, policies=("homo-R", "tessera"), layers=1,
                       prompt_tokens=8, context=8 + OUTPUT, output_tokens=OUTPUT, profile_repeats=1,
                       profile_warmup=0)
    return CompiledModel(s)


def eager_tokens(model: CompiledModel, request_id: int, prompt: int, n: int) -> tuple[int, ...]:
    """Greedy decoding of the request's prompt on an eager copy of the model, recomputing the whole sequence."""
    lm = copy.deepcopy(model.lm)
    ids = model.prompt(request_id, prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            t = int(lm(input_ids=ids[None], use_cache=False).logits[0, -1].argmax())
            out.append(t)
            ids = torch.cat([ids, torch.tensor([t])])
    return tuple(out)


def requests(n: int = 5):
    # prompt lengths 3..8 (padding in prefill) and output lengths 2..4 (requests join and leave buckets)
    reqs = make_requests([0.0] * n, [3 + (i * 2) % 6 for i in range(n)], [2 + i % 3 for i in range(n)])
    return with_poisson_arrivals(reqs, rate=50.0, seed=1)


def check(result, model, reqs):
    assert [r.id for r in result.results] == sorted(r.id for r in reqs)  # each request exactly once
    for r in result.results:
        assert r.tokens == eager_tokens(model, r.id, r.request.input_tokens, r.request.output_tokens), r.id


def test_served_tokens_equal_eager(compiled):
    reqs = requests()
    engine = CompiledEngine(compiled, "homo-R")
    result = serve(reqs, engine, "main", ServeConfig(buckets=BUCKETS), WallClock())
    check(result, compiled, reqs)
    assert result.steps["decode"] > 0 and not result.switches
    # homo-R: every launch on device 1, and the caches kept there: no executor copies any of them in or out (they
    # are bound into device 1's pool, whose fresh memory is NaN-poisoned: tokens equal eager only if that works)
    from torch_tessera.lowering.program import BufferKind
    from torch_tessera.runtime.schedule import CopyStep

    for key, ex in compiled.executors[("homo-R", "main")].items():
        assert set(ex.state_homes.values()) == {1}, key
        buffers = ex.program.buffers
        assert not [st for st in ex.schedule.steps
                    if isinstance(st, CopyStep) and buffers[st.buffer].kind == BufferKind.STATE], key


class SwitchEveryStep(PlanMonitor):
    """A monitor that flips between the two plans at every decision (forces switches mid-run)."""

    def decide(self, now: float) -> str:
        from torch_tessera.serving.monitor import SwitchEvent

        to = self.config.throughput_plan if self.plan == self.config.latency_plan else self.config.latency_plan
        self.switches.append(SwitchEvent(now, self.plan, to, float("nan")))
        self.plan = to
        return to


def test_plan_switches_keep_tokens(compiled):
    reqs = requests()
    engine = CompiledEngine(compiled, "tessera")
    result = serve(reqs, engine, SwitchEveryStep(MonitorConfig()), ServeConfig(buckets=BUCKETS), WallClock())
    check(result, compiled, reqs)
    assert len(result.switches) >= 3 and engine.switches == len(result.switches)
    assert {"latency", "throughput"} <= set(result.plan_step_s)


def test_bad_input_errors():
    with pytest.raises(UnsupportedModelError, match="unknown model"):
        EngineSettings(model="lama")
    with pytest.raises(ConfigError, match="KV cache"):
        EngineSettings(model="mamba")
    with pytest.raises(ConfigError, match="not served"):
        EngineSettings(policies=("request-dist",))


def test_serve_bench_real_engine_end_to_end(tmp_path, capsys, monkeypatch):
    import json

    from torch_tessera.cli import main

    if TEST_DEVICE != "cpu":
        pytest.skip("CPU virtual devices only")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    rc = main(["serve-bench", "--engine", "real", "--model", "llama", "--size", "tiny", "--layers", "1",
               "--devices", "cpu:0,cpu:1", "--rates", "20", "--requests", "3", "--input-len", "6", "--output-len",
               "3", "--buckets", "2", "--policies", "homo-L,tessera", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads((tmp_path / "out" / "serve_bench.json").read_text())
    assert report["engine"] == "real" and "measured on cpu:0,cpu:1" in report["cost_source"]
    assert {p["policy"] for p in report["points"]} == {"homo-L", "tessera"}
    assert all(p["requests"] == 3 and p["throughput_tok_s"] > 0 for p in report["points"])
    assert (tmp_path / "out" / "latency_vs_rate.png").stat().st_size > 0


def test_serve_bench_real_engine_rejects_model_without_kv_cache(capsys):
    from torch_tessera.cli import main

    assert main(["serve-bench", "--engine", "real", "--model", "mamba", "--size", "tiny", "--devices",
                 "cpu:0,cpu:1", "--rates", "1"]) == 2
    assert "KV cache" in capsys.readouterr().err


def test_plan_switches_keep_tokens_with_graphs(stand_in_graphs, tmp_path, monkeypatch):
    """CUDA graphs on (the pointer-faithful CPU stand-in, one graph over both devices per executor): prefill and
    every bucket's decode through each plan's executor, switched every step, give eager's greedy tokens; every
    executor captures once, and every replay touches only storages its pools still bind (the stand-in checks)."""
    if TEST_DEVICE != "cpu":
        pytest.skip("the stand-in replaces CUDA graphs on CPU virtual devices only")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    s = EngineSettings(devices="cpu:0,cpu:1", buckets=BUCKETS, policies=("tessera",), layers=1, prompt_tokens=8,
                       context=8 + OUTPUT, output_tokens=OUTPUT, profile_repeats=1, profile_warmup=0,
                       cuda_graphs=True)
    model = CompiledModel(s)
    reqs = requests(6)
    engine = CompiledEngine(model, "tessera")
    result = serve(reqs, engine, SwitchEveryStep(MonitorConfig()), ServeConfig(buckets=BUCKETS), WallClock())
    check(result, model, reqs)
    used = [ex for per in model.executors.values() for ex in per.values() if ex.calls]
    assert all(ex.cuda_graphs and ex.captures == 1 for ex in used)
    assert any(ex.calls > 1 and len(set(ex.schedule.placement.values())) == 2 for ex in used), "nothing replayed"
