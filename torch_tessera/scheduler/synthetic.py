"""Synthetic dependency DAGs and roofline costs, for tests and benchmarks of the scheduler.

The real DAG comes from ``graph/`` (a lowered program plus its PTX access summaries). These builders produce the same
:class:`~torch_tessera.graph.types.DependencyGraph` type from a hand-written kernel list, so the scheduler can be
developed and measured without a GPU or a lowered model: a transformer-like program (norm, QKV GEMM, KV-cache write,
attention, output GEMM, residual, MLP) with repeated layers, and a random layered DAG without repetition.

Costs are a roofline: ``seconds = max(flop / peak_flops, bytes / peak_bandwidth) + launch_seconds``, times a seeded
per-kernel noise factor so that no two kernels tie exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import networkx as nx
import numpy as np
import torch

from torch_tessera.graph.types import DependencyGraph, KernelNode, add_kernel
from torch_tessera.lowering.program import Buffer, BufferKind
from torch_tessera.target.costs import CostTable, Topology

Range = tuple[str, int, int]


@dataclass
class SynthKernel:
    """One kernel of a synthetic program.

    Attributes:
        name: kernel name (identical across repeated layers).
        op_class: one of ``graph.types.OP_CLASSES``.
        reads / writes: byte ranges ``(buffer, start, end)`` accessed.
        flop: floating-point operations of the kernel.
        layer: repeated-layer index or ``None``.
        unsure: whether the access analysis is unsure of this kernel.
    """

    name: str
    op_class: str
    reads: list[Range]
    writes: list[Range]
    flop: float
    layer: int | None = None
    unsure: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def moved_bytes(self) -> int:
        return sum(e - s for _, s, e in self.reads) + sum(e - s for _, s, e in self.writes)


def _sorted(ranges: Sequence[Range]) -> tuple[Range, ...]:
    return tuple(sorted((b, int(s), int(e)) for b, s, e in ranges))


def _overlap(a: Range, b: Range) -> int:
    return max(0, min(a[2], b[2]) - max(a[1], b[1])) if a[0] == b[0] else 0


def dag_from_kernels(kernels: Sequence[SynthKernel], buffers: dict[str, Buffer]) -> DependencyGraph:
    """Build the dependency DAG of a kernel list by tracking byte ranges per buffer, in program order.

    RAW edges carry the overlap of the consumer's reads with the producer's writes (bytes); WAR and WAW edges only
    order. Each node holds its :class:`~torch_tessera.graph.types.KernelNode`, and ``flop`` beside it for costing.
    """
    g = nx.DiGraph()
    writers: dict[str, list[tuple[int, Range]]] = {}
    readers: dict[str, list[tuple[int, Range]]] = {}
    for i, k in enumerate(kernels):
        add_kernel(g, KernelNode(index=i, name=k.name, kind="triton" if k.op_class != "gemm" else "extern",
                                 op_class=k.op_class, layer=k.layer, read_ranges=_sorted(k.reads),
                                 write_ranges=_sorted(k.writes), unsure=k.unsure,
                                 unsure_reason="synthetic" if k.unsure else ""))
        g.nodes[i]["flop"] = k.flop
        for r in k.reads:
            for j, w in writers.get(r[0], []):
                n = _overlap(r, w)
                if n:
                    _add_edge(g, j, i, "RAW", n, (r[0], max(r[1], w[1]), min(r[2], w[2])))
        for w in k.writes:
            for j, w0 in writers.get(w[0], []):
                if _overlap(w, w0):
                    _add_edge(g, j, i, "WAW", 0, None)
            for j, r0 in readers.get(w[0], []):
                if j != i and _overlap(w, r0):
                    _add_edge(g, j, i, "WAR", 0, None)
        for r in k.reads:
            readers.setdefault(r[0], []).append((i, r))
        for w in k.writes:
            writers.setdefault(w[0], []).append((i, w))
    return DependencyGraph(graph=g, buffers=dict(buffers))


def _add_edge(g: nx.DiGraph, u: int, v: int, kind: str, nbytes: int, rng: Range | None) -> None:
    if u == v:
        return
    if g.has_edge(u, v):
        d = g.edges[u, v]
        d["kinds"] = d["kinds"] | {kind}
        d["bytes"] += nbytes
        d["ranges"] = d["ranges"] + ((rng,) if rng else ())
    else:
        g.add_edge(u, v, kinds=frozenset({kind}), bytes=nbytes, ranges=(rng,) if rng else ())


def _buf(buffers: dict[str, Buffer], name: str, kind: BufferKind, nbytes: int) -> Range:
    buffers[name] = Buffer(name=name, kind=kind, dtype=torch.bfloat16, nbytes=int(nbytes), device="meta")
    return (name, 0, int(nbytes))


def transformer_dag(layers: int = 2, tokens: int = 64, hidden: int = 1024, ffn: int = 2816, context: int = 1024,
                    dtype_bytes: int = 2, kv_hidden: int | None = None, vocab: int = 32000,
                    unsure_every: int = 0, rope_tables: bool = False,
                    unlabelled_boundary: bool = False, first_layer_extra: bool = False) -> DependencyGraph:
    """A decoder-only transformer's kernel DAG: 11 kernels per layer plus embedding, final norm and LM head.

    Args:
        layers: number of decoder layers.
        tokens: tokens processed per step (batch x new tokens).
        hidden / ffn / vocab: model widths (elements).
        context: KV-cache length per sequence (tokens); attention reads the whole cache.
        dtype_bytes: bytes per element.
        kv_hidden: width of K (and of V); defaults to ``hidden // 4`` (grouped-query attention).
        unsure_every: mark every N-th ``silu_mul`` kernel unsure (0: none).
        rope_tables: add a kernel before the layers whose output every layer's ``rope_kv_write`` reads (as the
            RoPE cos/sin tables of real models: one producer, an edge into every layer).
        unlabelled_boundary: leave each layer's last ``add`` without a layer index (as Inductor's fused residual
            add + next RMSNorm, whose provenance spans two layers).
        first_layer_extra: give layer 0 one more kernel than the others (an input scaling before its first norm), as
            real models' first layer differs (Llama-3.1-8B's has an RMSNorm the others fuse into the previous layer).

    Returns:
        The DAG; KV caches are STATE buffers named ``kv.<layer>`` (shared by name between prefill and decode DAGs).
    """
    kvh = kv_hidden or hidden // 4
    b: dict[str, Buffer] = {}
    t, e = tokens, dtype_bytes
    act = lambda name, width: _buf(b, name, BufferKind.TEMP, t * width * e)  # noqa: E731
    ks: list[SynthKernel] = []
    tok = _buf(b, "tokens", BufferKind.INPUT, t * 8)
    w_emb = _buf(b, "embed.weight", BufferKind.PARAMETER, vocab * hidden * e)
    x = act("x.0", hidden)
    ks.append(SynthKernel("embedding", "other", [tok, w_emb], [x], 0.0))
    rope = None
    if rope_tables:
        rope = _buf(b, "rope", BufferKind.TEMP, t * (hidden // 8) * 2 * e)
        ks.append(SynthKernel("rope_tables", "elementwise", [tok], [rope], 4.0 * t * hidden // 8))
    for l in range(layers):
        p = f"layers.{l}."
        w = lambda n, size: _buf(b, p + n, BufferKind.PARAMETER, size * e)  # noqa: E731
        kv_bytes = 2 * t * context * kvh * e
        kv = _buf(b, f"kv.{l}", BufferKind.STATE, kv_bytes)
        new_kv = (kv[0], 0, 2 * t * kvh * e)  # this step's K/V rows
        h, qkv, q = act(p + "h", hidden), act(p + "qkv", hidden + 2 * kvh), act(p + "q", hidden)
        a, o, xm = act(p + "attn", hidden), act(p + "o", hidden), act(p + "xm", hidden)
        h2, gu, s = act(p + "h2", hidden), act(p + "gu", 2 * ffn), act(p + "s", ffn)
        d, xn = act(p + "d", hidden), act(f"x.{l + 1}", hidden)
        w_qkv, w_o = w("qkv.weight", hidden * (hidden + 2 * kvh)), w("o.weight", hidden * hidden)
        w_gu, w_d = w("gate_up.weight", hidden * 2 * ffn), w("down.weight", ffn * hidden)
        n1, n2 = w("norm1.weight", hidden), w("norm2.weight", hidden)
        unsure = bool(unsure_every) and l % unsure_every == 0
        if first_layer_extra and l == 0:
            xs = act("x.0s", hidden)
            ks.append(SynthKernel("scale", "elementwise", [x], [xs], 1.0 * t * hidden, l))
            x = xs
        ks += [
            SynthKernel("rmsnorm", "norm", [x, n1], [h], 4.0 * t * hidden, l),
            SynthKernel("mm_qkv", "gemm", [h, w_qkv], [qkv], 2.0 * t * hidden * (hidden + 2 * kvh), l),
            SynthKernel("rope_kv_write", "elementwise", [qkv] + ([rope] if rope else []), [q, new_kv],
                        6.0 * t * hidden, l),
            SynthKernel("attention", "attention", [q, kv], [a], 4.0 * t * context * hidden, l),
            SynthKernel("mm_o", "gemm", [a, w_o], [o], 2.0 * t * hidden * hidden, l),
            SynthKernel("add", "elementwise", [x, o], [xm], 1.0 * t * hidden, l),
            SynthKernel("rmsnorm", "norm", [xm, n2], [h2], 4.0 * t * hidden, l),
            SynthKernel("mm_gate_up", "gemm", [h2, w_gu], [gu], 4.0 * t * hidden * ffn, l),
            SynthKernel("silu_mul", "elementwise", [gu], [s], 4.0 * t * ffn, l, unsure=unsure),
            SynthKernel("mm_down", "gemm", [s, w_d], [d], 2.0 * t * hidden * ffn, l),
            SynthKernel("add", "elementwise", [xm, d], [xn], 1.0 * t * hidden, None if unlabelled_boundary else l),
        ]
        x = xn
    nf = _buf(b, "norm.weight", BufferKind.PARAMETER, hidden * e)
    hf, logits = act("hf", hidden), act("logits", vocab)
    w_head = _buf(b, "lm_head.weight", BufferKind.PARAMETER, vocab * hidden * e)
    ks.append(SynthKernel("rmsnorm", "norm", [x, nf], [hf], 4.0 * t * hidden))
    ks.append(SynthKernel("mm_lm_head", "gemm", [hf, w_head], [logits], 2.0 * t * hidden * vocab))
    return dag_from_kernels(ks, b)


def layered_dag(num_kernels: int, width: int = 4, fan_in: int = 2, seed: int = 0,
                nbytes: int = 1 << 20) -> DependencyGraph:
    """A random layered DAG without repetition: levels of ``width`` kernels, each reading ``fan_in`` outputs of the
    previous level (``nbytes`` each), each reading its own weight. No ``layer`` attribute, so no layer tying applies."""
    rng = np.random.default_rng(seed)
    b: dict[str, Buffer] = {}
    ks: list[SynthKernel] = []
    prev: list[Range] = []
    classes = ("gemm", "attention", "norm", "elementwise")
    for i in range(num_kernels):
        if i % width == 0:
            prev = [k.writes[0] for k in ks[-width:]] if ks else []
        ins = [prev[j] for j in rng.choice(len(prev), size=min(fan_in, len(prev)), replace=False)] if prev else []
        wt = _buf(b, f"w{i}", BufferKind.PARAMETER, int(rng.integers(1, 64)) << 20)
        out = _buf(b, f"t{i}", BufferKind.TEMP, int(nbytes * rng.uniform(0.25, 2.0)))
        cls = classes[int(rng.integers(len(classes)))]
        ks.append(SynthKernel(f"k{i}", cls, ins + [wt], [out], float(rng.uniform(1e9, 2e11))))
    return dag_from_kernels(ks, b)


#: Roofline figures (peak FLOP/s, peak bytes/s, launch seconds). "big" is an H200 as measured in docs/DESIGN.md
#: (~810 TFLOP/s bf16, ~4.25 TB/s copy); "small" is the same GPU limited to a 32-SM green context (218 TFLOP/s,
#: 2.22 TB/s, DESIGN.md table); "mid" sits between (481 TFLOP/s, 3.76 TB/s: the 72-SM partition).
DEVICE_PEAKS = {
    "big": (810e12, 4.25e12, 4e-6),
    "mid": (481e12, 3.76e12, 4e-6),
    "small": (218e12, 2.22e12, 4e-6),
}


def roofline_costs(dag: DependencyGraph, devices: Sequence[str], noise: float = 0.1, seed: int = 0,
                   peaks: dict | None = None) -> CostTable:
    """Roofline time of every kernel on every device (seconds), times a seeded ``1 +- noise`` factor per kernel name.

    Args:
        dag: a DAG built by this module (nodes carry ``flop``; bytes moved are the node's ranges).
        devices: keys of ``peaks`` (default :data:`DEVICE_PEAKS`), one per device.
        noise: relative half-width of the uniform noise factor.
        seed: noise seed.
        peaks: device name -> (FLOP/s, bytes/s, launch seconds).
    """
    peaks = peaks or DEVICE_PEAKS
    rng = np.random.default_rng(seed)
    nodes = sorted(dag.graph.nodes)
    sec = np.empty((len(nodes), len(devices)))
    for i, n in enumerate(nodes):
        flop, moved = dag.graph.nodes[n].get("flop", 0.0), dag.node(n).touched_bytes
        for j, dev in enumerate(devices):
            flops, bw, launch = peaks[dev]
            sec[i, j] = max(flop / flops, moved / bw) + launch
    # one factor per (kernel name, device): repeated layers cost the same, as profiles keyed by kernel and shape do
    names = sorted({dag.node(n).name for n in nodes})
    factor = dict(zip(names, rng.uniform(1 - noise, 1 + noise, size=(len(names), len(devices)))))
    sec *= np.array([factor[dag.node(n).name] for n in nodes])
    return CostTable(devices=tuple(devices), kernels=tuple(nodes), seconds=sec, source=f"synthetic roofline seed {seed}")


def nvlink_topology(devices: Sequence[str], bandwidth: float = 350e9, latency: float = 20e-6,
                    memory: Sequence[int] = ()) -> Topology:
    """All-pairs links at the H200 pair's measured peer-copy figures (docs/DESIGN.md: ~357 GB/s for 64 MiB copies,
    ~20 us per copy issued from Python)."""
    return Topology.uniform(devices, bandwidth, latency, memory)
