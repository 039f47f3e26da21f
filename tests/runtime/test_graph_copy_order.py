"""Ordering of the copies inside one CUDA graph over the devices, for both places a copy can run (``graph_copies``).

Inside a capture, work is ordered only by the streams it is issued on and the waits between them. Here the capture's
stream operations are replayed on recording streams (each operation a node depending on its stream's frontier, a
wait merging frontiers: what CUDA stream capture builds) for real schedules: the tiny Llama and MoE under random
placements over two devices. With copies on the link's copy stream (``"link"``, the default, whose results equal
eager under the copies' extreme legal timings: ``test_copy_hazards.py``) every copy must follow the launch that
precedes it on its source and precede the next launch on its destination; and every ordering of that way must also
hold with copies on the producer's stream (``"producer"``), which may only add orderings. With ``"push"`` some copies
run on the producer's stream (push kernels) and the others on the link's stream: every copy must still keep the
orderings ``copy_hazards`` asks for (the extreme timings of that mix: ``test_copy_hazards.py``).
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.models import build_model
from torch_tessera.runtime.graphs import order_copy
from torch_tessera.runtime.runner import random_placement
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="builds CPU virtual devices' schedules")


class _Capture:
    """The dependency graph stream capture would build: node -> bit mask of all its ancestors."""

    def __init__(self) -> None:
        self.ancestors: list[int] = []
        self.names: dict[tuple, int] = {}

    def node(self, stream: "_Stream", name: tuple | None) -> None:
        n = len(self.ancestors)
        mask = 0
        for p in stream.frontier:
            mask |= self.ancestors[p] | (1 << p)
        self.ancestors.append(mask)
        stream.frontier = {n}
        if name is not None:
            self.names[name] = n

    def before(self, a: tuple, b: tuple) -> bool:
        return bool(self.ancestors[self.names[b]] >> self.names[a] & 1)


class _Stream:
    def __init__(self, capture: _Capture) -> None:
        self.capture = capture
        self.frontier: set[int] = set()

    def wait_stream(self, other: "_Stream") -> None:
        self.frontier |= other.frontier


def _record(schedule, waits, n_devices: int, on_producer) -> _Capture:
    """Issue ``schedule`` as ``_capture_whole`` does, on recording streams (one per device, one per link).
    ``on_producer``: True (every copy on its producer's stream), False (every copy on its link's stream) or the set
    of step indices whose copies run on the producer's stream (push kernels)."""
    cap = _Capture()
    streams = [_Stream(cap) for _ in range(n_devices)]
    links: dict[tuple[int, int], _Stream] = {}
    for i, step in enumerate(schedule.steps):
        if isinstance(step, LaunchStep):
            cap.node(streams[step.device], ("launch", step.launch))
        elif isinstance(step, SyncStep):
            streams[step.dst].wait_stream(streams[step.src])
        else:
            producer = on_producer if isinstance(on_producer, bool) else i in on_producer
            link = None if producer else links.setdefault((step.src, step.dst), _Stream(cap))
            order_copy(streams[step.src], streams[step.dst], link, waits.get(id(step), (False, False)),
                       lambda s, i=i: cap.node(s, ("copy", i)))
    return cap


def _home_runner(model_name: str):
    """The tiny ``model_name`` compiled once on two CPU virtual devices (home placement); its runner."""
    torch.manual_seed(0)
    model, inputs = build_model(model_name, "tiny")
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(*inputs)
    return backend.executors[0]


@pytest.mark.parametrize("model_name", ["llama", "moe"])
def test_copies_on_the_producer_stream_keep_every_ordering_of_the_copy_streams(model_name):
    runner = _home_runner(model_name)
    copies_seen = 0
    for seed in range(8):
        runner.set_placement(random_placement(runner.dag, 2, seed))
        ex = runner.executor
        steps = ex.schedule.steps
        link = _record(ex.schedule, ex.copy_waits, len(ex.devices), on_producer=False)
        producer = _record(ex.schedule, ex.copy_waits, len(ex.devices), on_producer=True)
        for i, step in enumerate(steps):
            if not isinstance(step, CopyStep):
                continue
            copies_seen += 1
            before = [s for s in steps[:i] if isinstance(s, LaunchStep) and s.device == step.src]
            after = [s for s in steps[i + 1:] if isinstance(s, LaunchStep) and s.device == step.dst]
            for cap in (link, producer):
                if before:
                    assert cap.before(("launch", before[-1].launch), ("copy", i)), f"seed {seed}: copy {i} too early"
                if after:
                    assert cap.before(("copy", i), ("launch", after[0].launch)), f"seed {seed}: copy {i} too late"
        names = list(link.names)
        for b in names:
            for a in names:
                if a != b and link.before(a, b):
                    assert producer.before(a, b), f"seed {seed}: {a} before {b} with copy streams, not on producers"
    assert copies_seen > 0, "the placements cut nothing"


@pytest.mark.parametrize("model_name", ["llama", "moe"])
def test_push_and_link_copies_mixed_keep_the_hazard_orderings(model_name):
    runner = _home_runner(model_name)
    rng = random.Random(0)
    checked = 0
    for seed in range(8):
        runner.set_placement(random_placement(runner.dag, 2, seed))
        ex = runner.executor
        steps = ex.schedule.steps
        copies = [i for i, s in enumerate(steps) if isinstance(s, CopyStep)]
        pushed = {i for i in copies if rng.random() < 0.5}
        cap = _record(ex.schedule, ex.copy_waits, len(ex.devices), on_producer=pushed)
        for i in copies:
            step = steps[i]
            wait_dst, src_waits = ex.copy_waits[id(step)]
            src_before = [s for s in steps[:i] if isinstance(s, LaunchStep) and s.device == step.src]
            dst_before = [s for s in steps[:i] if isinstance(s, LaunchStep) and s.device == step.dst]
            src_after = [s for s in steps[i + 1:] if isinstance(s, LaunchStep) and s.device == step.src]
            dst_after = [s for s in steps[i + 1:] if isinstance(s, LaunchStep) and s.device == step.dst]
            need = [(src_before[-1:], "after"), (dst_after[:1], "before")]
            need += [(dst_before[-1:], "after")] if wait_dst else []
            need += [(src_after[:1], "before")] if src_waits else []
            for launches, rel in need:
                for launch in launches:
                    a, b = (("launch", launch.launch), ("copy", i))[::1 if rel == "after" else -1]
                    assert cap.before(a, b), f"seed {seed}: copy {i} ({'push' if i in pushed else 'link'}) " \
                                             f"not {rel} launch {launch.launch}"
                    checked += 1
        assert pushed and set(copies) - pushed, "the mix needs copies of both kinds"
    assert checked > 0
