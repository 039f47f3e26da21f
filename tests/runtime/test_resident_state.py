"""STATE kept on the device that owns it under a placement (`PlacedExecutor.set_state_homes`).

A KV cache that lives on the caller's (home) device is copied whole to every other device whose launches read it,
and its written bytes are gathered back, on every call: on two H200s a homo-R decode of 8 Llama-3.1-8B layers moved
2.3 GB each way per call (2026-11-29). Kept on its owner (the device of the launches that write it) it moves not at
all. These tests run decode steps of the tiny Llama with a static cache on two CPU virtual devices (separate pools,
fresh memory filled with NaN bytes, so state bound to the wrong device's pool computes garbage) and check every
step's logits and the final cache against eager.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import BufferKind
from torch_tessera.models import build_module, get_model
from torch_tessera.runtime.runner import random_placement
from torch_tessera.runtime.schedule import CopyStep
from torch_tessera.static_cache import StaticCacheLM

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="CPU virtual devices")

BATCH, CONTEXT, STEPS = 2, 8, 4


def _state_copies(executor) -> list[CopyStep]:
    buffers = executor.program.buffers
    return [s for s in executor.schedule.steps
            if isinstance(s, CopyStep) and buffers[s.buffer].kind == BufferKind.STATE]


def _compiled_decode():
    torch.manual_seed(0)
    lm = build_module("llama", "tiny").model
    module = StaticCacheLM(lm, BATCH, CONTEXT).eval()
    eager = copy.deepcopy(module)
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(module, backend=backend, dynamic=False)
    spec = get_model("llama")
    steps = []
    for t in range(STEPS):
        (ids,) = spec.example_inputs("tiny", BATCH, 1, seed=t)
        steps.append((ids, torch.full((BATCH, 1), t, dtype=torch.long)))
    with torch.no_grad():
        compiled(*steps[0])  # compile (home placement)
    return module, eager, compiled, backend.executors[0], steps


def _reset(module, eager) -> None:
    """Both caches empty again (the compile call wrote position 0)."""
    for m in (module, eager):
        for b in m.buffers():
            b.zero_()


@pytest.mark.parametrize("which", ["homo-R", "random"])
def test_state_on_its_owner_equals_eager_and_is_never_copied(which):
    module, eager, compiled, runner, steps = _compiled_decode()
    n = len(runner.program.launches)
    placement = {i: 1 for i in range(n)} if which == "homo-R" else random_placement(runner.dag, 2, seed=3)
    runner.set_placement(placement)
    ex = runner.executor
    owners = ex.state_owners()
    assert owners and set(owners) == {a.buffer for a in ex.program.inputs
                                      if ex.program.buffers[a.buffer].kind == BufferKind.STATE}
    before = _state_copies(ex)
    ex.set_state_homes(owners)
    after = _state_copies(ex)
    if which == "homo-R":
        assert all(d == 1 for d in owners.values())
        assert before, "with the cache at home, a homo-R step must copy it: this test could not fail"
        assert after == []  # neither copied in nor gathered back
    else:
        # what is left: readers on the device that does not own a buffer (the owner's copy goes to them)
        for s in after:
            assert s.purpose in ("input", "cut") and s.src == owners[s.buffer]
        assert sum(s.nbytes for s in after) < sum(s.nbytes for s in before)
    _reset(module, eager)
    with torch.no_grad():
        for t, (ids, pos) in enumerate(steps):
            got, want = compiled(ids, pos), eager(ids, pos)
            torch.testing.assert_close(got, want, msg=lambda m: f"{which}, step {t}: {m}")
    for (name, got), (_, want) in zip(module.named_buffers(), eager.named_buffers()):
        torch.testing.assert_close(got, want, msg=lambda m: f"{which}, cache buffer {name}: {m}")


def test_state_homes_errors_name_the_problem():
    _, _, _, runner, _ = _compiled_decode()
    ex = runner.executor
    with pytest.raises(TesseraError, match="not STATE inputs"):
        ex.set_state_homes({"no_such_buffer": 1})
    name = next(iter(ex.state_owners()))
    with pytest.raises(TesseraError, match="out of range"):
        ex.set_state_homes({name: 5})
