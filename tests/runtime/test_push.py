"""``graph_copies="push"``: the copy kernel, its layout, which copies it takes, and the runtime path on CPU devices.

The kernel runs here in Triton's interpreter on CPU tensors (two tensors' pointers, as on the GPU where one is the
peer's); the peer access itself only a GPU can check (``bench/gpu_runtime_check.py --graph-copies link,push``). On
CPU virtual devices the option falls back to the ordinary copies (``test_graph_calls.py``); here, in addition, every
cut copy is forced through the push path (warm-up pass eagerly, capture and replays with the stand-in graph), which
must still compute what eager does and count the same transfers as ``"link"``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.backend.test_models_equal_eager import StatefulCounter
from tests.conftest import TEST_DEVICE, RecordingBackend
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from torch_tessera.runtime import push
from torch_tessera.runtime.push import PUSH_MAX_BYTES, push_copy, push_layout
from torch_tessera.runtime.schedule import CopyStep

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="Triton's interpreter and CPU virtual devices")


def test_layout_is_the_widest_aligned_split():
    for src in range(16):
        for dst in range(16):
            for n in (0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 100):
                lay = push_layout(4096 + src, 8192 + dst, n)
                w = lay.width
                assert lay.nbytes == n and lay.head < w and lay.tail < w and lay.words >= 0
                widest = max(k for k in (1, 2, 4, 8) if (src - dst) % k == 0)
                assert w == widest, (src, dst, n, lay)
                if lay.words:
                    assert (4096 + src + lay.head) % w == 0 and (8192 + dst + lay.head) % w == 0
                    assert lay.head == (-(4096 + src)) % w  # the body starts at the first aligned byte
    with pytest.raises(ValueError):
        push_layout(0, 0, -1)


@pytest.mark.parametrize("src_off,dst_off,n", [(0, 0, 8), (0, 0, 40000), (3, 3, 1500), (3, 5, 1500), (1, 1, 7),
                                               (2, 6, 9000), (5, 5, 0), (7, 7, 1), (8, 0, 4096 * 3 + 8),
                                               (6, 2, 4099)])
def test_kernel_copies_exactly_the_range(src_off, dst_off, n):
    g = torch.Generator().manual_seed(n)
    src_store = torch.randint(0, 256, (n + 64,), dtype=torch.uint8, generator=g)
    dst_store = torch.zeros(n + 64, dtype=torch.uint8)
    lay = push_copy(src_store[src_off:src_off + n], dst_store[dst_off:dst_off + n])
    assert torch.equal(dst_store[dst_off:dst_off + n], src_store[src_off:src_off + n]), lay
    assert not dst_store[:dst_off].any() and not dst_store[dst_off + n:].any(), "wrote outside the range"


def test_kernel_when_the_storage_base_is_not_aligned_like_the_address():
    """A storage whose base is 1 byte past an 8-byte boundary: ``Tensor.view(int64)`` refuses the aligned body
    (its storage offset is odd), so the body goes through ``triton.reinterpret``."""
    backing = np.zeros(4097, dtype=np.uint8)
    dst = torch.from_numpy(backing[1:])  # storage base = address, misaligned by 1
    assert dst.data_ptr() % 8 == (backing.ctypes.data + 1) % 8
    phase = dst.data_ptr() % 8
    src_store = torch.randint(0, 256, (4200,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    src = src_store[phase:phase + 4000]  # same phase mod 8 as dst
    lay = push_copy(src, dst[:4000])
    assert lay.width == 8 and torch.equal(dst[:4000], src) and not dst[4000:].any()


def test_push_copy_rejects_other_tensors():
    with pytest.raises(ValueError, match="1-D contiguous uint8"):
        push_copy(torch.zeros(4), torch.zeros(4))


def _dev(kind: str, index: int | None = None):
    return SimpleNamespace(torch_device=torch.device(kind, index) if index is not None else torch.device(kind))


def test_which_copies_are_pushed():
    cut = CopyStep(0, 1, "buf0", 0, 1024, "cut", (1, 2))
    gpu0, gpu1 = _dev("cuda", 0), _dev("cuda", 1)
    assert push.refusal(cut, gpu0, gpu1) is None
    assert push.refusal(CopyStep(0, 1, "buf0", 0, PUSH_MAX_BYTES, "cut", (1, 2)), gpu0, gpu1) is None
    assert push.refusal(CopyStep(0, 1, "buf0", 0, PUSH_MAX_BYTES + 1, "cut", (1, 2)), gpu0, gpu1) == "over 16 MiB"
    assert push.refusal(CopyStep(0, 1, "x", 0, 64, "input"), gpu0, gpu1) == "input copy"
    assert push.refusal(CopyStep(1, 0, "y", 0, 64, "gather"), gpu1, gpu0) == "gather copy"
    assert push.refusal(cut, _dev("cpu"), _dev("cpu")) == "not between two GPUs"
    assert push.refusal(cut, gpu0, _dev("cuda", 0)) == "within one GPU"


@pytest.fixture
def forced_push(monkeypatch):
    """Every cut copy between any two devices is pushed (CPU devices have no peers to ask)."""
    monkeypatch.setattr(push, "refusal", lambda step, a, b, max_bytes=PUSH_MAX_BYTES:
                        None if step.purpose == "cut" else f"{step.purpose} copy")
    monkeypatch.setattr(push, "peer_access", lambda a, b: True)


def _run(graph_copies: str, calls: int = 3):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs=True, graph_copies=graph_copies, devices="cpu:0,cpu:1", policy="random",
                               seed=4)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for call in range(calls):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), ref(x), msg=lambda m: f"{graph_copies}, call {call}: {m}")
    return backend.executors[0].executor


def test_forced_push_path_equals_eager_and_counts_like_link(stand_in_graphs, forced_push, monkeypatch):
    """Warm-up pass: push kernels on the producer's stream; capture: push kernel nodes; 2 replays of them."""
    launches = []
    kernel = push._kernel
    monkeypatch.setattr(push, "_kernel", lambda: launches.append(1) or kernel())
    ex = _run("push")
    state = ex.graphs.entry()
    cuts = [c for c in state.copies if c.purpose == "cut"]
    assert cuts and state.pushes == frozenset(id(c) for c in cuts)
    assert len(launches) == 3 * len(cuts), "each call (the capturing warm-up and 2 replays) pushes every cut"
    link = _run("link")
    assert not link.graphs.entry().pushes
    assert ex.transfers == link.transfers and ex.bytes_moved == link.bytes_moved
    assert ex.cut_edges_transferred == link.cut_edges_transferred > 0


def test_forced_push_on_the_tiny_llama_equals_eager(stand_in_graphs, forced_push):
    """Many cut copies of real byte ranges (row slices of activations, K/V), under a random placement."""
    from torch_tessera.models import build_model

    torch.manual_seed(0)
    torch._dynamo.reset()
    model, inputs = build_model("llama", "tiny")
    with torch.no_grad():
        want = model(*inputs)
        backend = RecordingBackend(cuda_graphs=True, graph_copies="push", devices="cpu:0,cpu:1", policy="random",
                                   seed=1)
        compiled = torch.compile(model, backend=backend, dynamic=False)
        for call in range(2):  # the capturing call (warm-up pass) and a replay
            torch.testing.assert_close(compiled(*inputs), want, msg=lambda m: f"call {call}: {m}")
    assert len(backend.executors[0].executor.graphs.entry().pushes) > 10, "the placement cut too little to test"
