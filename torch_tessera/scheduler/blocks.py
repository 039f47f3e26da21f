"""Decision blocks: kernels that share one placement decision, and the problem aggregated over them.

Two partitions are used. *Groups* (hard, from :mod:`problem`): kernels that must share a device. *Tied classes*:
the kernel at position ``r`` of every repeated layer with identical structure. The throughput planner turns tied
classes into counts (:mod:`counts`); the list heuristic and the latency MILP use them as one shared decision (a
restriction). Aggregating costs, cut-edge loads and resident buffers over a partition is exact for placements that
respect it, so a tied placement is scored exactly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from torch_tessera.scheduler.evaluate import link_coef
from torch_tessera.scheduler.problem import Problem, _UnionFind

log = logging.getLogger(__name__)


@dataclass
class Blocks:
    """The problem aggregated over a partition of the kernels.

    Attributes:
        label: ``[n]`` block of each kernel.
        cost: ``[B, D]`` seconds per workload step of each block on each device.
        pinned: ``[B]`` device a block is pinned to, or -1.
        forbidden: ``[D]`` devices no block may use (memory budget below the activation reserve).
        esrc / edst / coef: aggregated data edges between different blocks, ``coef[e, a, b]`` seconds per workload
            step on link ``a -> b`` when ``esrc[e]`` runs on ``a`` and ``edst[e]`` on ``b``.
        res_bytes / res_holders: resident buffers merged by identical holder-block sets (bytes, block indices).
    """

    label: np.ndarray
    cost: np.ndarray
    pinned: np.ndarray
    forbidden: np.ndarray
    esrc: np.ndarray
    edst: np.ndarray
    coef: np.ndarray
    res_bytes: np.ndarray
    res_holders: list[np.ndarray]

    @property
    def B(self) -> int:
        return self.cost.shape[0]

    def expand(self, block_place: np.ndarray) -> np.ndarray:
        """Kernel placement ``[n]`` from a block placement ``[B]``."""
        return block_place[self.label]


def aggregate(pb: Problem, label: np.ndarray) -> Blocks:
    """Aggregate ``pb`` over the partition ``label`` (``[n]`` block ids 0..B-1, a coarsening of ``pb.group``)."""
    B = int(label.max()) + 1 if len(label) else 0
    D = pb.D
    cost = np.zeros((B, D))
    np.add.at(cost, label, pb.wcost)
    pinned = np.full(B, -1, dtype=np.int64)
    gp = pb.pinned[pb.group]
    has = gp >= 0
    pinned[label[has]] = gp[has]
    ls, lt = label[pb.esrc], label[pb.edst]
    keep = (ls != lt) & (pb.ewbytes > 0)
    coef_all = link_coef(pb)
    if keep.any():
        keys = ls[keep] * B + lt[keep]
        uniq, inv = np.unique(keys, return_inverse=True)
        coef = np.zeros((len(uniq), D, D))
        np.add.at(coef, inv, coef_all[keep])
        esrc, edst = uniq // B, uniq % B
    else:
        coef, esrc, edst = np.zeros((0, D, D)), np.zeros(0, np.int64), np.zeros(0, np.int64)
    merged: dict[tuple[int, ...], int] = {}
    for r in pb.resident:
        key = tuple(np.unique(label[r.holders]).tolist())
        merged[key] = merged.get(key, 0) + r.nbytes
    cap = pb.budgets - pb.reserve
    return Blocks(label=label, cost=cost, pinned=pinned, forbidden=cap < 0, esrc=esrc, edst=edst, coef=coef,
                  res_bytes=np.array(list(merged.values()), dtype=np.float64),
                  res_holders=[np.array(k, dtype=np.int64) for k in merged])


def layer_units(pb: Problem) -> list[int | None]:
    """Layer *unit* of each kernel: its ``layer`` attribute, or for a kernel without one that sits between two
    layered kernels of its program (Inductor fuses the residual add and the next RMSNorm into one kernel whose
    provenance spans two layers) the layer of the nearest preceding layered kernel; ``None`` before a program's first
    layer and after its last (embedding, final norm, head), so that the last layer keeps the shape of the others."""
    unit: list[int | None] = [None] * pb.n
    for p in range(len(pb.programs)):
        ks = pb.program_slice(p).tolist()
        labelled = [i for i, k in enumerate(ks) if pb.layer[k] is not None]
        if not labelled:
            continue
        cur = None
        for i in range(labelled[0], labelled[-1] + 1):
            k = ks[i]
            if pb.layer[k] is not None:
                cur = pb.layer[k]
            unit[k] = cur
    return unit


def tie_layers(pb: Problem, align: bool = True) -> tuple[np.ndarray, int]:
    """Tie the decisions of repeated layers with identical structure.

    Layers are the units of :func:`layer_units` (FX/Inductor provenance, unlabelled kernels joining the preceding
    layer). A unit's structure is its kernels' op classes in program order and its internal data edges (positions and
    bytes); kernel names are not compared (Inductor names the same fused RMSNorm differently in different layers).
    Tying is only used as a relaxation (counts, least cost over a class) or a restriction that is scored exactly, so
    members need not cost the same. Groups pinned to a device are never tied, so tying cannot break a pin.

    With ``align``, units of every other structure are then aligned with the program's most common one by their op
    class sequences (``difflib``; kept when at least :data:`ALIGN_MIN` of the longer sequence matches) and the matched
    kernels tied too. Real lowered LLMs need this: Llama-3.1-8B's first layer has an extra RMSNorm and its last the
    LM head, and Inductor's buffer reuse makes odd and even layers differ in one residual edge, so exact structures
    left 94 of 182 classes as single groups (2 x 2 layers of 23 kernels) and split the rest in two.

    Returns:
        ``(label, tied_layers)``: a partition coarsening ``pb.group``, and how many layers were tied to another.
    """
    G = int(pb.group.max()) + 1 if pb.n else 0
    uf = _UnionFind(G)
    units = layer_units(pb)
    members: dict[tuple[int, int], list[int]] = {}
    for k in range(pb.n):
        if units[k] is not None:
            members.setdefault((int(pb.prog[k]), int(units[k])), []).append(k)
    pos = {k: i for ks in members.values() for i, k in enumerate(ks)}
    internal: dict[tuple[int, int], list[tuple[int, int, float]]] = {key: [] for key in members}
    for s, t, b in zip(pb.esrc.tolist(), pb.edst.tolist(), pb.ebytes.tolist()):
        if b > 0 and units[s] is not None and units[s] == units[t] and pb.prog[s] == pb.prog[t]:
            internal[(int(pb.prog[s]), int(units[s]))].append((pos[s], pos[t], b))
    by_sig: dict[tuple, list[tuple[int, int]]] = {}
    for key, ks in members.items():
        sig = (key[0], tuple(pb.op_class[k] for k in ks), tuple(sorted(internal[key])))
        by_sig.setdefault(sig, []).append(key)

    def tie(k0: int, k: int) -> None:
        g0, g = int(pb.group[k0]), int(pb.group[k])
        if pb.pinned[g0] < 0 and pb.pinned[g] < 0:
            uf.union(g0, g)

    tied = 0
    for keys in by_sig.values():
        for key in keys[1:]:
            for k0, k in zip(members[keys[0]], members[key]):
                tie(k0, k)
            tied += 1
    if align:
        tied += _align_structures(pb, by_sig, members, tie)
    label = uf.labels()[pb.group]
    log.debug("layer tying: %d layers tied, %d groups -> %d blocks", tied, G, int(label.max()) + 1 if pb.n else 0)
    return label, tied


#: Least fraction of the longer op-class sequence that must match for :func:`tie_layers` to align two structures.
ALIGN_MIN = 0.8


def _align_structures(pb: Problem, by_sig: dict, members: dict, tie) -> int:
    """Tie the kernels of each unit whose structure is not its program's most common one to the matching kernels
    of a unit that has it (op class sequences aligned by ``difflib``). Returns how many units were tied."""
    import difflib

    common: dict[int, tuple] = {}
    for sig, keys in by_sig.items():  # per program the structure with most units (the first one seen on ties)
        if sig[0] not in common or len(keys) > len(by_sig[common[sig[0]]]):
            common[sig[0]] = sig
    tied = 0
    for sig, keys in by_sig.items():
        ref = common[sig[0]]
        if sig == ref:
            continue
        blocks = difflib.SequenceMatcher(None, ref[1], sig[1], autojunk=False).get_matching_blocks()
        if sum(b.size for b in blocks) < ALIGN_MIN * max(len(ref[1]), len(sig[1])):
            continue
        k_ref = members[by_sig[ref][0]]
        for key in keys:
            for b in blocks:
                for i in range(b.size):
                    tie(k_ref[b.a + i], members[key][b.b + i])
            tied += 1
    return tied


def block_loads_many(blocks: Blocks, bplaces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compute loads ``[P, D]`` and link loads ``[P, D * D]`` (seconds per step) of ``[P, B]`` block placements.

    Each entry sums its terms in block (edge) order, as a one-placement ``np.bincount`` / ``np.add.at`` does, so the
    values equal the one-placement ones bit for bit."""
    bplaces = np.asarray(bplaces, dtype=np.int64)
    P, D = bplaces.shape[0], blocks.cost.shape[1]
    w = blocks.cost[np.arange(blocks.B)[None], bplaces]
    dev = np.bincount((np.arange(P)[:, None] * D + bplaces).ravel(), weights=w.ravel(), minlength=P * D)
    a, b = bplaces[:, blocks.esrc], bplaces[:, blocks.edst]
    pi, ei = np.nonzero(a != b)
    a, b = a[pi, ei], b[pi, ei]
    link = np.bincount(pi * D * D + a * D + b, weights=blocks.coef[ei, a, b], minlength=P * D * D)
    return dev.reshape(P, D), link.reshape(P, D * D)


def block_cycle_many(blocks: Blocks, bplaces: np.ndarray) -> np.ndarray:
    """Cycle times ``[P]`` of ``[P, B]`` block placements (each equal to :func:`block_cycle` of its row)."""
    dev, link = block_loads_many(blocks, bplaces)
    return np.maximum(dev.max(1), link.max(1))


def block_cycle(blocks: Blocks, bplace: np.ndarray) -> float:
    """Cycle time of a block placement (equals :func:`evaluate.cycle_seconds` of its expansion)."""
    return float(block_cycle_many(blocks, np.asarray(bplace)[None])[0])


def memory_binds(pb: Problem, blocks: Blocks) -> bool:
    """Whether some placement could break a memory budget: ``False`` when every resident buffer together with the
    activation reserve fits on each device (then no placement can overflow and memory checks can be skipped)."""
    if np.isinf(pb.budgets).all():
        return False
    return bool(np.any(float(blocks.res_bytes.sum()) + pb.reserve > pb.budgets * (1 + 1e-9)))


def block_memory_ok_many(pb: Problem, blocks: Blocks, bplaces: np.ndarray) -> np.ndarray:
    """``[P]`` bool: whether each of ``[P, B]`` block placements fits the budgets (resident bytes + activation
    reserve on every used device)."""
    bplaces = np.asarray(bplaces, dtype=np.int64)
    P, D = bplaces.shape[0], pb.D
    if not memory_binds(pb, blocks):
        return np.ones(P, dtype=bool)
    sizes = [len(h) for h in blocks.res_holders]
    buf = np.repeat(np.arange(len(sizes)), sizes)
    hold = np.concatenate(blocks.res_holders) if sizes else np.zeros(0, np.int64)
    on = np.zeros((P, len(sizes), D), dtype=bool)
    on[np.arange(P)[:, None], buf[None], bplaces[:, hold]] = True
    used = np.einsum("prd,r->pd", on.astype(np.float64), blocks.res_bytes)
    dev_on = (bplaces[:, :, None] == np.arange(D)[None, None]).any(1)
    return np.all(~dev_on | (used + pb.reserve <= pb.budgets * (1 + 1e-9)), axis=1)


def block_memory_ok(pb: Problem, blocks: Blocks, bplace: np.ndarray) -> bool:
    """Whether a block placement fits the budgets (resident bytes + activation reserve on every used device)."""
    return bool(block_memory_ok_many(pb, blocks, np.asarray(bplace)[None])[0])
