"""Cut-edge copies inside one CUDA graph as a copy kernel run by the PRODUCER's GPU, writing the peer's memory.

``graph_copies="push"`` (see :class:`~torch_tessera.runtime.placed.PlacedExecutor`): inside the one graph over the
devices, each cut-edge copy of at most :data:`PUSH_MAX_BYTES` between two GPUs with peer access runs as
:func:`push_copy` on the producer's stream, and the consumer's stream waits on the producer's (no copy stream, no
memcpy node). Everything else (larger copies, inputs and gathers, CPU devices) keeps the memcpy on the link's copy
stream.

Per hop between two H200s a push kernel costs about 5 us less than a memcpy node at every measured size
(8 KiB-4 MiB; docs/BENCHMARKS.md, hop variants).

The kernel copies a byte range ``[0, n)`` between two storages: the body as the widest words (8, 4, 2 or 1 bytes)
both addresses allow, the bytes before and after it (at most 7 each) bytewise by program 0 (:func:`push_layout`).
Peer access: torch enables it on its first copy between two GPUs (``copy_`` calls ``at::cuda::get_p2p_access(src,
dst)``, which also maps expandable segments for the peer); :func:`peer_access` makes such a copy both ways before a
capture, since a graph's kernels may otherwise be the first to touch the peer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import triton.language as tl

from torch_tessera.runtime.streams import order_copy

#: Largest copy pushed by a kernel (bytes); larger ones keep the memcpy node on the link's copy stream. Beyond it
#: the copy engine's bandwidth and the producer's free SMs matter more than ~5 us of latency; untested above 4 MiB
#: (docs/BENCHMARKS.md, hop variants).
PUSH_MAX_BYTES = 16 << 20

#: Bytes each program of the kernel copies (the hop bench's kernel: 1024 float32 per program, 4 warps).
BLOCK_BYTES = 4096

#: Word widths the body may use, widest first, with the integer dtype of each.
WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}

#: Byte lanes program 0 has for the head (lanes 0-7) and the tail (lanes 8-15); head and tail are < 8 bytes each.
EDGE_LANES = 8


@dataclass(frozen=True)
class PushLayout:
    """How :func:`push_copy` splits ``nbytes`` bytes: ``head`` bytes, then ``words`` words of ``width`` bytes
    (the body, aligned to ``width`` at both addresses), then ``tail`` bytes. ``head``, ``tail`` < ``width`` <= 8."""

    width: int
    head: int
    words: int
    tail: int

    @property
    def body_end(self) -> int:
        """Byte offset where the tail starts."""
        return self.head + self.words * self.width

    @property
    def nbytes(self) -> int:
        return self.body_end + self.tail


def push_layout(src_addr: int, dst_addr: int, nbytes: int) -> PushLayout:
    """The widest-word layout for copying ``nbytes`` bytes from address ``src_addr`` to ``dst_addr``.

    The word width is the widest of 8, 4, 2, 1 bytes at which the two addresses have the same phase (then one head
    length aligns both); a copy whose addresses differ in phase by an odd number of bytes goes bytewise.

    Args:
        src_addr: first source byte's address (``Tensor.data_ptr()``).
        dst_addr: first destination byte's address.
        nbytes: bytes to copy (>= 0).
    """
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes} must be >= 0")
    width = next(w for w in WORD_DTYPES if (src_addr - dst_addr) % w == 0)
    head = min((-src_addr) % width, nbytes)
    words = (nbytes - head) // width
    return PushLayout(width, head, words, nbytes - head - words * width)


def refusal(step: Any, src_device: Any, dst_device: Any, max_bytes: int = PUSH_MAX_BYTES) -> str | None:
    """Why copy ``step`` (a :class:`~torch_tessera.runtime.schedule.CopyStep`) cannot be pushed, or None if it can
    (peer access aside: :func:`peer_access` decides that on the GPUs).

    Args:
        step: the copy.
        src_device / dst_device: the runtime devices (``.torch_device``) it copies between.
        max_bytes: largest copy pushed.
    """
    if step.purpose != "cut":
        return f"{step.purpose} copy"
    if step.nbytes > max_bytes:
        return f"over {max_bytes >> 20} MiB"
    a, b = src_device.torch_device, dst_device.torch_device
    if a.type != "cuda" or b.type != "cuda":
        return "not between two GPUs"
    if a.index == b.index:
        return "within one GPU"
    return None


def peer_access(a: int, b: int) -> bool:
    """Whether GPUs ``a`` and ``b`` can reach each other's memory; if they can, make sure access is enabled both
    ways, by one 1-byte ``copy_`` each way (torch's ``get_p2p_access``; call outside a graph capture)."""
    if a == b:
        return True
    if not (torch.cuda.can_device_access_peer(a, b) and torch.cuda.can_device_access_peer(b, a)):
        return False
    x = torch.zeros(1, dtype=torch.uint8, device=f"cuda:{a}")
    y = torch.zeros(1, dtype=torch.uint8, device=f"cuda:{b}")
    y.copy_(x)
    x.copy_(y)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    return True


def _push_body(src_w, dst_w, words, src_b, dst_b, head, tail_start, tail, BLOCK: tl.constexpr, EDGES: tl.constexpr):
    """Triton kernel (jitted by :func:`_kernel`): words ``[0, words)`` of ``src_w`` into ``dst_w``; with ``EDGES``,
    program 0 also copies bytes ``[0, head)`` and ``[tail_start, tail_start + tail)`` of ``src_b`` into ``dst_b``."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < words
    tl.store(dst_w + offs, tl.load(src_w + offs, mask=mask), mask=mask)
    if EDGES:
        if pid == 0:
            lane = tl.arange(0, 16)
            pos = tl.where(lane < 8, lane, tail_start + lane - 8)
            keep = tl.where(lane < 8, lane < head, lane - 8 < tail)
            tl.store(dst_b + pos, tl.load(src_b + pos, mask=keep), mask=keep)


_KERNELS: dict[bool, Any] = {}  # interpreter on? -> the jitted kernel (@triton.jit reads TRITON_INTERPRET when applied)


def _kernel() -> Any:
    import triton

    from torch_tessera.compat.triton import interpreter_enabled

    key = interpreter_enabled()
    if key not in _KERNELS:
        _KERNELS[key] = triton.jit(_push_body, do_not_specialize=["head", "tail_start", "tail"])
    return _KERNELS[key]


def _words(t: torch.Tensor, dtype: torch.dtype) -> Any:
    """``t`` (1-D uint8) as ``dtype`` words: a view where torch allows one, else Triton's reinterpretation (the
    storage's base is not aligned like the address, so ``view`` refuses although the address is aligned)."""
    if dtype == torch.uint8:
        return t
    try:
        return t.view(dtype)
    except RuntimeError:
        import triton

        return triton.reinterpret(t, dtype)


def push_copy(src: torch.Tensor, dst: torch.Tensor) -> PushLayout:
    """Copy ``src`` into ``dst`` (1-D contiguous ``uint8`` tensors of one length, on any devices the current one can
    address: the peer's memory with peer access) with one launch of the copy kernel on the current device's current
    stream. Returns the layout it used.

    Raises:
        ValueError: the tensors are not 1-D contiguous uint8 of equal length.
    """
    if src.dtype != torch.uint8 or dst.dtype != torch.uint8 or src.dim() != 1 or dst.shape != src.shape or \
            not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError(f"push_copy needs two 1-D contiguous uint8 tensors of one length, got {src.dtype} "
                         f"{tuple(src.shape)} and {dst.dtype} {tuple(dst.shape)}")
    lay = push_layout(src.data_ptr(), dst.data_ptr(), src.numel())
    if lay.nbytes == 0:
        return lay
    dtype = WORD_DTYPES[lay.width]
    body = slice(lay.head, lay.body_end)
    block = BLOCK_BYTES // lay.width
    grid = (max(1, -(-lay.words // block)),)
    _kernel()[grid](_words(src[body], dtype), _words(dst[body], dtype), lay.words, src, dst, lay.head,
                    lay.body_end, lay.tail, BLOCK=block, EDGES=bool(lay.head or lay.tail))
    return lay


def push_on_producer(device: Any, src: torch.Tensor, dst: torch.Tensor, src_stream: Any, dst_stream: Any,
                     waits: tuple[bool, bool]) -> None:
    """Issue one copy step as :func:`push_copy` on the producer's stream, ordered by
    :func:`~torch_tessera.runtime.streams.order_copy` without a copy stream: after the producer's earlier work (and
    the consumer's, when ``waits`` says so), before the consumer's later work. Used eagerly (the warm-up pass) and
    inside a capture.

    Args:
        device: the producer's runtime device (its ``guard()`` makes it current: Triton launches on the current
            device's current stream).
        src / dst: the step's bytes on the producer and on the consumer (1-D uint8 storage slices).
        src_stream / dst_stream: the producer's and the consumer's streams.
        waits: ``(wait_for_dst, src_waits_for_copy)`` from :func:`~torch_tessera.runtime.schedule.copy_hazards`.
    """
    def issue(stream: Any) -> None:
        on_stream = torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else contextlib.nullcontext()
        with device.guard(), on_stream:
            push_copy(src, dst)

    order_copy(src_stream, dst_stream, None, waits, issue)
