"""Static INPUTs (``KernelProgram.static_inputs``: module buffers Dynamo passes at one address every call) read on
another device are placed there once, like weights, not copied every call; and placed again when the caller moves
or modifies them, so every call still equals eager.

Why: measured 2026-11-30 on two H200s (session 7 bench.json of the MMDiT, homo-R at 72 SMs: 15.50 ms of kernels,
1.16 ms of copies per call), the MMDiT's 453,509,120-byte ``pos_embed`` buffer was copied to GPU 1 on every call.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from tests.conftest import TEST_DEVICE, RecordingBackend
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from tests.runtime.test_pipelining import _compile
from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import BufferKind
from torch_tessera.runtime.placed import tensor_key
from torch_tessera.runtime.schedule import build_schedule

if TEST_DEVICE != "cpu":
    pytest.skip("CPU virtual devices only", allow_module_level=True)


class WithTable(torch.nn.Module):
    """A linear layer scaled by a module buffer (like the MMDiT's ``pos_embed``): a static input of Dynamo's."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("table", torch.arange(16.0) / 8, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.table + 1


@dataclass
class Case:
    """The compiled model, its runner and the program's input list, with the positions of ``x`` and the table."""

    model: WithTable
    runner: Any
    args: list
    x_at: int
    table_at: int

    def inputs(self, x: torch.Tensor, table: torch.Tensor | None = None) -> list:
        out = list(self.args)
        out[self.x_at], out[self.table_at] = x, self.model.table if table is None else table
        return out

    def call(self, x: torch.Tensor, table: torch.Tensor | None = None) -> None:
        """One call of the executor on ``x`` (and ``table`` for the buffer, default the module's), checked."""
        table = self.model.table if table is None else table
        with torch.no_grad():
            out = [o for o in self.runner.executor.run(self.inputs(x, table)) if isinstance(o, torch.Tensor)][0]
            torch.testing.assert_close(out, self.model.lin(x) * table + 1)


def _case(graphs: bool, request) -> Case:
    """The compiled model's runner with every launch on device 1 (``cpu:1``): the table is read off its home."""
    if graphs:
        request.getfixturevalue("stand_in_graphs")
    torch.manual_seed(0)
    model = WithTable().eval()
    x = torch.randn(4, 16)
    runner, args = _compile(model, (x,))
    assert runner.program.static_inputs == ("table",)
    runner.cuda_graphs = graphs
    runner.set_placement(_on_device_1(runner))
    return Case(model, runner, list(args), [a is x for a in args].index(True),
                [a is model.table for a in args].index(True))


def _on_device_1(runner) -> dict[int, int]:
    return {i: 1 for i in range(len(runner.program.launches))}


def test_schedule_places_a_static_input_once_over_the_per_call_span(request):
    case = _case(False, request)
    program, dag = case.runner.program, case.runner.dag
    sched = build_schedule(program, dag, _on_device_1(case.runner))
    static = [s for s in sched.setup if s.purpose == "static"]
    assert [(s.src, s.dst, s.buffer) for s in static] == [(0, 1, "table")]
    assert program.buffers["table"].kind == BufferKind.INPUT
    assert not [s for s in sched.steps if getattr(s, "buffer", None) == "table"]  # no per-call copy
    assert all(s.purpose == "weights" for s in sched.setup if s.buffer != "table")
    # not a static input: the same bytes are a per-call input copy
    older = build_schedule(dataclasses.replace(program, static_inputs=()), dag, _on_device_1(case.runner))
    per_call = [s for s in older.copies("input") if s.buffer == "table"]
    assert [(s.start, s.end) for s in per_call] == [(s.start, s.end) for s in static]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_static_input_copied_once_and_again_when_the_caller_changes_it(graphs, request):
    case = _case(graphs, request)
    ex, table = case.runner.executor, case.model.table
    nbytes = case.runner.program.buffers["table"].nbytes
    x_bytes = 4 * 16 * 4  # x, float32: the only per-call input copy
    for call in range(3):  # (a) equal to eager; (b) the table crosses once, at the first call
        case.call(torch.randn(4, 16))
        assert (ex.bytes_moved["static"], ex.transfers["static"]) == (nbytes, 1), call
        assert ex.bytes_moved["input"] == x_bytes * (call + 1), call
    with torch.no_grad():
        table.add_(1)  # (c) in place: same address, another version -> copied again, once
    for _ in range(2):
        case.call(torch.randn(4, 16))
        assert ex.bytes_moved["static"] == 2 * nbytes
    other = torch.linspace(-1, 1, 16)  # (d) another tensor (another address) -> placed again, once
    for _ in range(2):
        case.call(torch.randn(4, 16), table=other)
        assert ex.bytes_moved["static"] == 3 * nbytes
    case.call(torch.randn(4, 16))  # back to the module's buffer
    assert ex.bytes_moved["static"] == 4 * nbytes and ex.bytes_moved["input"] == x_bytes * 8
    if graphs:
        assert ex.captures == 3  # each move recaptured (placing the table again); the in-place change did not
        assert not any(s.buffer == "table" for s in ex.graphs.entry().copies)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_inference_tensor_is_placed_every_call(graphs, request, caplog):
    """A tensor made under ``torch.inference_mode`` has no version counter: its key is ``(data_ptr, None)``, always
    stale, so it is placed again every call and a change in place (which no key could show) is still seen. With
    graphs that costs two host synchronisations per call: logged once, naming ``static_inputs="copy"``."""
    case = _case(graphs, request)
    ex = case.runner.executor
    with torch.inference_mode():
        table = torch.linspace(0, 1, 16)
    assert tensor_key(table) == (table.data_ptr(), None)
    with caplog.at_level(logging.WARNING, logger="torch_tessera"):
        for calls in (1, 2, 3):
            case.call(torch.randn(4, 16), table=table)  # equal to eager with the table as it is now
            assert ex.transfers["static"] == calls
            with torch.inference_mode():
                table.mul_(-1.5)  # same address, no version to bump
    warned = [r.getMessage() for r in caplog.records if "inference tensors" in r.getMessage()]
    assert len(warned) == (1 if graphs else 0) and all("'static_inputs': 'copy'" in m for m in warned), warned


def test_pipelined_inference_tensor_is_placed_once_per_run_not_per_micro_batch(request):
    """The run places it before its first wave (while no slot reads it); the micro-batches do not place it again."""
    case = _case(False, request)
    ex, model = case.runner.executor, case.model
    with torch.inference_mode():
        table = torch.linspace(0, 1, 16)
    for run in (1, 2):
        xs = [torch.randn(4, 16) for _ in range(3)]
        with torch.no_grad():
            got = ex.run_pipelined([case.inputs(x, table) for x in xs], slots=2)
            for x, out in zip(xs, got):
                torch.testing.assert_close([o for o in out if isinstance(o, torch.Tensor)][0],
                                           model.lin(x) * table + 1)
        assert ex.transfers["static"] == run, "placed once per micro-batch, not once per run"
        with torch.inference_mode():
            table.add_(0.5)  # placed again by the next run


def _compiled(static_inputs: str, graphs: bool, request) -> tuple[WithTable, Any, Any]:
    """``WithTable`` compiled with ``options={"static_inputs": static_inputs}`` on ``cpu:0,cpu:1`` and placed wholly
    on ``cpu:1`` (the table is read off its home); returns the model, the compiled callable and its runner."""
    if graphs:
        request.getfixturevalue("stand_in_graphs")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = WithTable().eval()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home", static_inputs=static_inputs,
                               cuda_graphs=graphs)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        compiled(torch.randn(4, 16))
    runner = backend.executors[0]
    assert runner.program.static_inputs == ("table",)
    runner.set_placement(_on_device_1(runner))
    return model, compiled, runner


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_copy_mode_sees_a_write_through_data(graphs, request):
    """``t.data.add_`` does not bump ``_version``: with ``static_inputs="copy"`` (the option, through
    ``torch.compile``) the table is copied to cpu:1 every call and the write is seen; with the default ``"place"``
    the placed copy is stale (the documented contract: such writes need ``"copy"``)."""
    for mode in ("copy", "place"):
        model, compiled, runner = _compiled(mode, graphs, request)
        ex = runner.executor
        assert ex.static_inputs == mode
        with torch.no_grad():
            for call in range(3):
                x = torch.randn(4, 16)
                version = model.table._version
                if call:
                    model.table.data.add_(1)
                assert model.table._version == version  # the write bumped nothing
                got, want = compiled(x), model.lin(x) * model.table + 1
                if mode == "copy":
                    torch.testing.assert_close(got, want, msg=lambda m: f"{mode}, call {call}: {m}")
                elif call:
                    assert not torch.allclose(got, want), "a .data write was seen with 'place': the test is moot"
        for _ in range(2):  # set_state_homes rebuilds the schedule, with the same static_inputs
            table_steps = [s for s in [*ex.schedule.setup, *ex.schedule.steps] if getattr(s, "buffer", None) == "table"]
            assert table_steps and {s.purpose for s in table_steps} == {"input" if mode == "copy" else "static"}
            ex.set_state_homes({})
        if mode == "copy":
            assert ex.transfers["static"] == 0 and ex.transfers["input"] >= 3 * len(table_steps)


def test_weight_cache_is_not_used_for_static_inputs(request):
    case = _case(False, request)
    runner = case.runner
    runner.weight_cache = {}
    runner.set_placement(_on_device_1(runner))
    case.call(torch.randn(4, 16))
    first = runner.executor
    assert runner.weight_cache and not [k for k in runner.weight_cache if k[0] == case.model.table.data_ptr()]
    runner.set_placement(_on_device_1(runner))
    with torch.no_grad():
        case.model.table.mul_(-1)
    case.call(torch.randn(4, 16))  # a second executor: weights from the cache, its own current copy of the table
    assert runner.executor.bytes_moved["static"] == first.bytes_moved["static"] > 0
    assert runner.executor.bytes_moved["weights"] == 0


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_pipelined_micro_batches_share_the_placed_static_input(graphs, request):
    case = _case(graphs, request)
    ex, model = case.runner.executor, case.model
    nbytes = case.runner.program.buffers["table"].nbytes
    for run in range(3):
        if run == 2:
            with torch.no_grad():
                model.table.add_(0.5)  # between runs: placed again before the run's first wave
        xs = [torch.randn(4, 16) for _ in range(3)]
        with torch.no_grad():
            got = ex.run_pipelined([case.inputs(x) for x in xs], slots=2)
            for x, out in zip(xs, got):
                want = model.lin(x) * model.table + 1
                torch.testing.assert_close([o for o in out if isinstance(o, torch.Tensor)][0], want)
        assert ex.bytes_moved["static"] == nbytes * (1 if run < 2 else 2), run
    batches = [case.inputs(torch.randn(4, 16)), case.inputs(torch.randn(4, 16), model.table.clone())]
    with pytest.raises(TesseraError, match="another tensor for static input"):
        ex.run_pipelined(batches, slots=2)


def test_distributed_send_mode_refuses_a_changed_static_input(request):
    """``weights="send"`` sends a static input once, like the weights; the home rank refuses a call whose static
    tensor changed since (the other ranks would compute with the old bytes). No process group is needed: the first
    call's sends are skipped by marking the setup done after recording what was sent."""
    from torch_tessera.runtime.distributed import DistContext, DistributedExecutor

    case = _case(False, request)
    ctx = DistContext(rank=0, world_size=2, backend="gloo", device=torch.device("cpu"), timeout_s=1.0)
    ex = DistributedExecutor(case.runner.program, case.runner.dag, _on_device_1(case.runner), ctx, weights="send")
    assert [s.purpose for s in ex.schedule.setup if s.buffer == "table"] == ["static"]
    first = ex.new_call(case.inputs(torch.randn(4, 16)), 0)
    ex._static_sent, ex._setup_done = dict(first.static_keys), True
    ex.setup(ex.new_call(case.inputs(torch.randn(4, 16)), 1))  # unchanged: nothing to do
    with torch.no_grad():
        case.model.table.add_(1)
    with pytest.raises(TesseraError, match=r"static inputs \['table'\] moved or were modified in place"):
        ex.setup(ex.new_call(case.inputs(torch.randn(4, 16)), 2))
    with pytest.raises(TesseraError, match="static inputs"):
        ex.setup(ex.new_call(case.inputs(torch.randn(4, 16), torch.zeros(16)), 3))
    local = DistributedExecutor(case.runner.program, case.runner.dag, _on_device_1(case.runner),
                                DistContext(1, 2, "gloo", torch.device("cpu"), 1.0), weights="local")
    call = local.new_call(case.inputs(torch.randn(4, 16)), 0)  # rank 1 binds its own parameters and table
    assert "table" in call.pool and "x" not in {a.buffer for a in case.runner.program.inputs if a.buffer in call.pool}
    local.setup(call)  # "local": nothing is sent, nothing checked


def test_distributed_send_mode_refuses_an_inference_tensor_at_the_first_call(request):
    """Sent once, an inference tensor's later changes could never be seen (no version counter): the home rank refuses
    it at the first call, before sending anything (so no process group is needed here), naming the ways out."""
    from torch_tessera.runtime.distributed import DistContext, DistributedExecutor

    case = _case(False, request)
    ctx = DistContext(rank=0, world_size=2, backend="gloo", device=torch.device("cpu"), timeout_s=1.0)
    ex = DistributedExecutor(case.runner.program, case.runner.dag, _on_device_1(case.runner), ctx, weights="send")
    with torch.inference_mode():
        table = torch.linspace(0, 1, 16)
    with pytest.raises(TesseraError, match=r"static inputs \['table'\] are inference tensors .*outside "
                                           r"torch.inference_mode, or use weights='local' or static_inputs='copy'"):
        ex.run(case.inputs(torch.randn(4, 16), table))
    assert not ex._setup_done and ex.stats.ranges == {}  # nothing was sent
    copy = DistributedExecutor(case.runner.program, case.runner.dag, _on_device_1(case.runner), ctx,
                               weights="send", static_inputs="copy")
    assert [s.purpose for s in copy.schedule.steps if getattr(s, "buffer", None) == "table"] == ["input"]
    assert not [s for s in copy.schedule.setup if s.buffer == "table"]


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="gloo on CPU virtual devices")
def test_two_gloo_ranks_with_an_inference_tensor_static_input(tmp_path):
    """Two real gloo ranks (``tests/runtime/dist_static_rank.py``), rank 1 reading the inference-tensor table:
    ``static_inputs="copy"`` sends it every call (a change in place between calls is seen); ``weights="send"`` with
    the default ``"place"`` fails at the first call: rank 0 with the clear error, rank 1 with ``PeerFailureError``."""
    import json
    import subprocess
    import sys

    from tests.runtime.test_distributed import ROOT, _env, _free_port

    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.runtime.dist_static_rank",
                                       str(tmp_path / f"rank{rank}.json")], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert len(r0["copy_diffs"]) == 2 and max(r0["copy_diffs"]) < 1e-5, r0["copy_diffs"]
    assert "static" not in r0["copy_ranges"] and r0["copy_ranges"]["input"] >= 4, r0["copy_ranges"]  # x, table x 2
    assert r0["place_error"].startswith("TesseraError: rank 0: static inputs ['table'] are inference tensors"), r0
    assert "static_inputs='copy'" in r0["place_error"]
    assert (r1["place_error"] or "").startswith("PeerFailureError"), r1
