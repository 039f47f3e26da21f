"""Copies run on their own streams: the waits `schedule.copy_hazards` asks for must be enough under any legal timing.

On a GPU a copy step is ordered only by events: after its producer's stream; before its consumer's stream; and,
where `copy_hazards` says so, after the destination's earlier work and before the source's later work. Issued from
Python the copies mostly ran in program order anyway; inside one CUDA graph they do not (a random placement replayed
as one graph on two H200s gave cosine 0.84 before these waits, 2026-11-29). Here the CPU executor runs the steps in
the two extreme orders those events allow, every copy as LATE as possible and every copy as EARLY as possible, and
the result must still equal eager. Without the hazard waits at least one placement must go wrong, so the test can fail.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.models import build_model
from torch_tessera.runtime.runner import random_placement
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep, copy_hazards

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="reorders the steps of CPU virtual devices")


def _late(steps, hazards, dom, pushed=frozenset()):
    """Each copy delayed until a launch that must see it: one on the destination's domain, or (when the source must
    wait for it, or it runs on the source's stream: the step indices in ``pushed``) one on the source's domain."""
    out, pending = [], []
    for i, st in enumerate(steps):
        if isinstance(st, CopyStep):
            pending.append((i, st))
            continue
        if isinstance(st, LaunchStep):
            d = dom[st.device]
            keep = []
            for j, c in pending:
                if dom[c.dst] == d or ((hazards[j][1] or j in pushed) and dom[c.src] == d):
                    out.append(c)
                else:
                    keep.append((j, c))
            pending = keep
        else:  # a SyncStep orders everything
            out.extend(c for _, c in pending)
            pending = []
        out.append(st)
    return out + [c for _, c in pending]


def _early(steps, hazards, dom, pushed=frozenset()):
    """Each copy hoisted to right after the last step it must follow: its source's last launch, the copies that
    filled its source and earlier copies on its link (one stream per link), and the destination's last launch when
    it must wait for it. A copy in ``pushed`` (step indices: a push kernel on the source's stream) follows, instead
    of its link's earlier copies, the earlier pushes from its source and the copies its source waited for; a link
    copy also follows the earlier pushes from its source (it waits for the source's stream)."""
    out: list = []
    index = {id(st): i for i, st in enumerate(steps)}
    for i, st in enumerate(steps):
        if not isinstance(st, CopyStep):
            out.append(st)
            continue
        pos = 0
        for k, prev in enumerate(out):
            if isinstance(prev, LaunchStep) and (dom[prev.device] == dom[st.src]
                                                 or (hazards[i][0] and dom[prev.device] == dom[st.dst])):
                pos = k + 1
            elif isinstance(prev, CopyStep):
                j = index[id(prev)]
                same_source = dom[prev.src] == dom[st.src]
                if dom[prev.dst] == dom[st.src] or (same_source and j in pushed):
                    pos = k + 1
                elif i in pushed and same_source and hazards[j][1]:
                    pos = k + 1
                elif i not in pushed and j not in pushed and (prev.src, prev.dst) == (st.src, st.dst):
                    pos = k + 1
            elif isinstance(prev, SyncStep):
                pos = k + 1
        out.insert(pos, st)
    return out


def _run(compiled, runner, seed, inputs, order_of):
    """Run ``compiled`` with the random placement ``seed`` and its steps in the order ``order_of(steps)``."""
    runner.set_placement(random_placement(runner.dag, 2, seed))
    ex = runner.executor
    order = order_of(ex.schedule.steps)
    waits = dict(ex.copy_waits)  # the hazards of the schedule's own order, by step (the same step objects)
    ex.schedule = type(ex.schedule)(ex.schedule.setup, tuple(order), ex.schedule.placement, ex.schedule.cut_edges)
    ex.derive_from_schedule()  # exec items in the new order
    ex.machine.copy_waits = waits
    ex.free_after = {}  # frees were placed for program order
    return compiled(*inputs)


@pytest.mark.parametrize("model_name", ["llama", "moe"])
def test_copies_at_their_extreme_legal_times_equal_eager(model_name):
    torch.manual_seed(0)
    model, inputs = build_model(model_name, "tiny")
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        want = copy.deepcopy(model)(*inputs)
        compiled(*inputs)
        runner = backend.executors[0]
        wrong_without_waits = checked = 0
        for seed in range(12):
            runner.set_placement(random_placement(runner.dag, 2, seed))
            ex = runner.executor
            steps, dom = ex.schedule.steps, ex.domains
            hazards = copy_hazards(ex.schedule, runner.dag, dom)
            assert set(hazards) == {i for i, s in enumerate(steps) if isinstance(s, CopyStep)}
            none = {i: (False, False) for i in hazards}
            for reorder in (_late, _early):
                got = _run(compiled, runner, seed, inputs, lambda st: reorder(st, hazards, dom))
                torch.testing.assert_close(got, want, msg=lambda m: f"seed {seed}, {reorder.__name__}: {m}")
                checked += 1
                bad = _run(compiled, runner, seed, inputs, lambda st: reorder(st, none, dom))
                wrong_without_waits += not torch.allclose(bad, want)
    assert checked == 24
    assert wrong_without_waits > 0, "no placement needed the hazard waits: this test could not fail"


@pytest.mark.parametrize("model_name", ["llama", "moe"])
def test_push_and_link_copies_mixed_at_their_extreme_legal_times_equal_eager(model_name):
    """``graph_copies="push"``: copies up to a size run as push kernels on the producer's stream, the others on the
    link's stream; here a random half of the copies is pushed."""
    torch.manual_seed(0)
    model, inputs = build_model(model_name, "tiny")
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    rng = random.Random(0)
    with torch.no_grad():
        want = copy.deepcopy(model)(*inputs)
        compiled(*inputs)
        runner = backend.executors[0]
        for seed in range(6):
            runner.set_placement(random_placement(runner.dag, 2, seed))
            ex = runner.executor
            steps, dom = ex.schedule.steps, ex.domains
            hazards = copy_hazards(ex.schedule, runner.dag, dom)
            pushed = {i for i in hazards if rng.random() < 0.5}
            for reorder in (_late, _early):
                got = _run(compiled, runner, seed, inputs, lambda st: reorder(st, hazards, dom, pushed))
                torch.testing.assert_close(got, want, msg=lambda m: f"seed {seed}, {reorder.__name__}: {m}")
            if seed == 0:  # the same mix without the hazard waits goes wrong: this test can fail
                none = {i: (False, False) for i in hazards}
                bad = _run(compiled, runner, seed, inputs, lambda st: _early(st, none, dom, pushed))
                assert not torch.allclose(bad, want), "the mix needed no hazard wait: this test could not fail"
