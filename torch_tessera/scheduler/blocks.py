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

from torch_tessera.scheduler.evaluate import device_coef, holder_entries, link_coef
from torch_tessera.scheduler.problem import Memo, Problem

log = logging.getLogger(__name__)


@dataclass
class Blocks(Memo):
    """The problem aggregated over a partition of the kernels.

    Attributes:
        label: ``[n]`` block of each kernel.
        cost: ``[B, D]`` seconds per workload step of each block on each device.
        pinned: ``[B]`` device a block is pinned to, or -1.
        forbidden: ``[D]`` devices no block may use (memory budget below the activation reserve).
        esrc / edst / coef: aggregated data edges between different blocks, ``coef[e, a, b]`` seconds per workload
            step on link ``a -> b`` when ``esrc[e]`` runs on ``a`` and ``edst[e]`` on ``b``.
        res_bytes / res_holders: resident buffers merged by identical holder-block sets (bytes, block indices).
        dcoef: ``[E, D, D]`` seconds per workload step the same edge adds to EACH of devices ``a`` and ``b``
            (:meth:`Problem.device_coef`: per-hop overhead and exposed copy time), or ``None`` when cut edges charge
            no device.
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
    dcoef: np.ndarray | None = None

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
    dcoef_all = device_coef(pb)
    dcoef = None
    if keep.any():
        keys = ls[keep] * B + lt[keep]
        uniq, inv = np.unique(keys, return_inverse=True)
        coef = np.zeros((len(uniq), D, D))
        np.add.at(coef, inv, coef_all[keep])
        if dcoef_all is not None:
            dcoef = np.zeros((len(uniq), D, D))
            np.add.at(dcoef, inv, dcoef_all[keep])
        esrc, edst = uniq // B, uniq % B
    else:
        coef, esrc, edst = np.zeros((0, D, D)), np.zeros(0, np.int64), np.zeros(0, np.int64)
    merged: dict[tuple[int, ...], int] = {}
    buf, ker, nbytes = holder_entries(pb)
    pairs = np.unique(buf * max(B, 1) + label[ker])  # (buffer, block) holding it, by buffer then block
    owner = pairs // max(B, 1)
    cuts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1], True]).tolist() if len(pairs) else [0]
    held, owners, sizes = (pairs % max(B, 1)).tolist(), owner.tolist(), nbytes.tolist()
    for a, b in zip(cuts[:-1], cuts[1:]):  # each buffer's holder blocks, as slices of one Python list
        key = tuple(held[a:b])
        merged[key] = merged.get(key, 0) + int(sizes[owners[a]])
    cap = pb.budgets - pb.reserve
    return Blocks(label=label, cost=cost, pinned=pinned, forbidden=cap < 0, esrc=esrc, edst=edst, coef=coef,
                  res_bytes=np.array(list(merged.values()), dtype=np.float64),
                  res_holders=[np.array(k, dtype=np.int64) for k in merged], dcoef=dcoef)


def layer_units(pb: Problem) -> list[int | None]:
    """Layer *unit* of each kernel: its ``layer`` attribute, or for a kernel without one that sits between two
    layered kernels of its program (Inductor fuses the residual add and the next RMSNorm into one kernel whose
    provenance spans two layers) the layer of the nearest preceding layered kernel; ``None`` before a program's first
    layer and after its last (embedding, final norm, head), so that the last layer keeps the shape of the others.
    Computed once per problem (the list is shared: do not modify it)."""
    return pb.memo("layer_units", lambda: _layer_units(pb))


def _layer_units(pb: Problem) -> list[int | None]:
    lay = np.array([-1 if l is None else int(l) for l in pb.layer], dtype=np.int64)
    out = np.full(pb.n, -1, dtype=np.int64)
    for p in range(len(pb.programs)):
        ks = pb.program_slice(p)
        l = lay[ks]
        labelled = np.flatnonzero(l >= 0)
        if not len(labelled):
            continue
        last = np.maximum.accumulate(np.where(l >= 0, np.arange(len(ks)), -1))  # nearest labelled kernel before
        span = slice(labelled[0], labelled[-1] + 1)
        out[ks[span]] = l[last[span]]
    return [None if u < 0 else u for u in out.tolist()]


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
        ``(label, tied_layers)``: a partition coarsening ``pb.group`` (blocks numbered in the order of their first
        group), and how many layers were tied to another.
    """
    G = int(pb.group.max()) + 1 if pb.n else 0
    units = layer_units(pb)
    uarr = np.array([-1 if u is None else u for u in units], dtype=np.int64)
    # each (program, unit)'s kernels in kernel order, units in the order of their first kernel (arrays, not a loop)
    kern = np.flatnonzero(uarr >= 0)
    ukey = pb.prog[kern] * (int(uarr.max()) + 1 if len(kern) else 1) + uarr[kern]
    order = np.argsort(ukey, kind="stable")
    kern, ukey = kern[order], ukey[order]
    start = np.flatnonzero(np.r_[True, ukey[1:] != ukey[:-1]]) if len(kern) else np.zeros(0, np.int64)
    seg = np.cumsum(np.r_[True, ukey[1:] != ukey[:-1]]) - 1 if len(kern) else np.zeros(0, np.int64)
    pos = np.zeros(pb.n, dtype=np.int64)  # position of a kernel in its unit
    pos[kern] = np.arange(len(kern)) - start[seg]
    unit_of = np.full(pb.n, -1, dtype=np.int64)
    unit_of[kern] = seg
    bounds = np.r_[start, len(kern)].tolist()
    kl, prog = kern.tolist(), pb.prog.tolist()
    segs = np.argsort(kern[start], kind="stable").tolist()  # by first kernel
    members: dict[tuple[int, int], list[int]] = {
        (prog[kl[bounds[j]]], units[kl[bounds[j]]]): kl[bounds[j]:bounds[j + 1]] for j in segs}
    inside = np.flatnonzero((pb.ebytes > 0) & (uarr[pb.esrc] >= 0) & (uarr[pb.esrc] == uarr[pb.edst])
                            & (pb.prog[pb.esrc] == pb.prog[pb.edst]))
    es, et = pb.esrc[inside], pb.edst[inside]
    eseg, ps, pt, eb = unit_of[es], pos[es], pos[et], pb.ebytes[inside]
    o = np.lexsort((eb, pt, ps, eseg))  # each unit's internal edges as sorted (position, position, bytes) triples
    eseg, trip = eseg[o], list(zip(ps[o].tolist(), pt[o].tolist(), eb[o].tolist()))
    ecut = np.searchsorted(eseg, np.arange(len(start) + 1)).tolist()
    ocls = pb.op_class
    by_sig: dict[tuple, list[tuple[int, int]]] = {}
    for j, (key, ks) in zip(segs, members.items()):
        sig = (key[0], tuple([ocls[k] for k in ks]), tuple(trip[ecut[j]:ecut[j + 1]]))
        by_sig.setdefault(sig, []).append(key)
    pairs: list[tuple[list[int], list[int]]] = []  # kernels to tie, as (kernels, kernels) of equal length
    tied = 0
    for keys in by_sig.values():
        for key in keys[1:]:
            pairs.append((members[keys[0]], members[key]))
            tied += 1
    if align:
        tied += _align_structures(by_sig, members, pairs)
    label = _tie_groups(pb, G, pairs)[pb.group]
    log.debug("layer tying: %d layers tied, %d groups -> %d blocks", tied, G, int(label.max()) + 1 if pb.n else 0)
    return label, tied


def _tie_groups(pb: Problem, G: int, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
    """Block of each group once the groups of every kernel pair are joined (pinned groups left alone); blocks are
    numbered in the order of their smallest group, as :meth:`problem._UnionFind.labels` numbers them."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not pairs or not G:
        return np.arange(G, dtype=np.int64)
    a = pb.group[np.concatenate([np.asarray(x, dtype=np.int64) for x, _ in pairs])]
    b = pb.group[np.concatenate([np.asarray(y, dtype=np.int64) for _, y in pairs])]
    free = (pb.pinned[a] < 0) & (pb.pinned[b] < 0)
    graph = coo_matrix((np.ones(int(free.sum())), (a[free], b[free])), shape=(G, G))
    _, label = connected_components(graph, directed=False)  # numbered as first seen scanning groups 0, 1, ...
    return label.astype(np.int64)


#: Least fraction of the longer op-class sequence that must match for :func:`tie_layers` to align two structures.
ALIGN_MIN = 0.8


def _align_structures(by_sig: dict, members: dict, pairs: list) -> int:
    """Add to ``pairs`` the kernels of each unit whose structure is not its program's most common one, with the
    matching kernels of a unit that has it (op class sequences aligned by ``difflib``). Returns how many units."""
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
        ia = [b.a + i for b in blocks for i in range(b.size)]
        ib = [b.b + i for b in blocks for i in range(b.size)]
        for key in keys:
            pairs.append(([k_ref[i] for i in ia], [members[key][i] for i in ib]))
            tied += 1
    return tied


def block_loads_many(blocks: Blocks, bplaces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compute loads ``[P, D]`` and link loads ``[P, D * D]`` (seconds per step) of ``[P, B]`` block placements.

    Each entry sums its terms in block (edge) order, as a one-placement ``np.bincount`` / ``np.add.at`` does, so the
    values equal the one-placement ones bit for bit. Device loads include the cut edges' device charges
    (``blocks.dcoef``), added after the blocks' costs."""
    bplaces = np.asarray(bplaces, dtype=np.int64)
    P, D = bplaces.shape[0], blocks.cost.shape[1]
    w = np.take(blocks.cost.ravel(), bplaces + np.arange(blocks.B) * D)  # cost[b, bplaces[p, b]], one flat gather
    dev = np.bincount((np.arange(P)[:, None] * D + bplaces).ravel(), weights=w.ravel(), minlength=P * D)
    a, b = bplaces[:, blocks.esrc], bplaces[:, blocks.edst]
    pi, ei = np.divmod(np.flatnonzero(a != b), max(len(blocks.esrc), 1))  # np.nonzero's order, row-major
    a, b = a[pi, ei], b[pi, ei]
    link = np.bincount(pi * D * D + a * D + b, weights=blocks.coef[ei, a, b], minlength=P * D * D)
    if blocks.dcoef is not None and len(pi):
        dv = blocks.dcoef[ei, a, b]
        dev = dev + np.bincount(np.r_[pi * D + a, pi * D + b], weights=np.r_[dv, dv], minlength=P * D)
    return dev.reshape(P, D), link.reshape(P, D * D)


def incident_edges(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """CSR incidence of the aggregated edges: block ``b``'s edges (either end) are ``edge[ptr[b]:ptr[b + 1]]``, in
    ascending order; built once per :class:`Blocks`."""
    def compute() -> tuple[np.ndarray, np.ndarray]:
        E = len(blocks.esrc)
        ends = np.concatenate([blocks.esrc, blocks.edst])
        edge = np.concatenate([np.arange(E), np.arange(E)])
        order = np.lexsort((edge, ends))
        return np.r_[0, np.cumsum(np.bincount(ends, minlength=blocks.B))], edge[order]

    return blocks.memo("incidence", compute)


def moved_loads_many(blocks: Blocks, bplace: np.ndarray, move: np.ndarray, group: np.ndarray, to: np.ndarray,
                     M: int, dev: np.ndarray, link: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Loads after each of ``M`` moves of a few blocks, from the current loads over the moved blocks only.

    Move ``m`` sends block ``group[i]`` to device ``to[i]`` for every ``i`` with ``move[i] == m`` (each block at most
    once per move); the other blocks stay where ``bplace`` has them. Costs change for the moved blocks, and link loads
    and the device charges of cut edges (``blocks.dcoef``, on both end devices) for the edges incident to them, so a
    move of ``k`` blocks costs ``O(k x degree)``, not ``O(B + E)``. The sums can differ from :func:`block_loads_many`
    of the moved placements in the last bits (they add the changes to ``dev`` and ``link`` instead of summing every
    term).

    Args:
        blocks: the aggregated problem.
        bplace: ``[B]`` current device of each block.
        move / group / to: ``[K]`` move index (``0..M-1``), block and its new device, one entry per moved block.
        M: number of moves.
        dev / link: ``[D]`` and ``[D * D]`` loads of ``bplace`` (seconds per workload step).

    Returns:
        ``([M, D] device loads, [M, D * D] link loads)`` after each move alone.
    """
    D, E, B = blocks.cost.shape[1], len(blocks.esrc), blocks.B
    old = bplace[group]
    ddev = np.bincount(move * D + to, weights=blocks.cost[group, to], minlength=M * D)
    ddev -= np.bincount(move * D + old, weights=blocks.cost[group, old], minlength=M * D)
    dev1 = dev[None] + ddev.reshape(M, D)
    if not E or not len(group):
        return dev1, np.repeat(link[None], M, axis=0)
    em, e, moved, dest = touched_edges(blocks, move, group, to)

    def where_now(end: np.ndarray) -> np.ndarray:  # an edge end's device under its move
        k = em * B + end
        i = np.minimum(np.searchsorted(moved, k), len(moved) - 1)
        return np.where(moved[i] == k, dest[i], bplace[end])

    a0, b0 = bplace[blocks.esrc[e]], bplace[blocks.edst[e]]
    a1, b1 = where_now(blocks.esrc[e]), where_now(blocks.edst[e])
    ddev, dlink = edge_load_deltas(blocks, e, em, (a0, b0), (a1, b1), M)
    return dev1 + ddev, link[None] + dlink


def touched_edges(blocks: Blocks, move: np.ndarray, group: np.ndarray,
                  to: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The edges each move touches, once per (move, edge), and the moved blocks as sorted keys.

    Args:
        blocks: the aggregated problem.
        move / group / to: ``[K]`` move index, block and its new device, one entry per moved block.

    Returns:
        ``(em, e, moved, dest)``: ``em`` / ``e`` the move and edge index of each touched (move, edge) pair;
        ``moved`` the sorted keys ``move x B + block`` of the moved blocks and ``dest`` their new devices, in that
        order (for ``np.searchsorted`` lookups of an edge end's device under its move).
    """
    E, B = len(blocks.esrc), blocks.B
    ptr, inc = incident_edges(blocks)
    cnt = ptr[group + 1] - ptr[group]
    within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    key = np.unique(np.repeat(move, cnt) * E + inc[np.repeat(ptr[group], cnt) + within])  # (move, edge), once
    moved = move * B + group
    order = np.argsort(moved)
    return key // E, key % E, moved[order], to[order]


def edge_load_deltas(blocks: Blocks, e: np.ndarray, em: np.ndarray, before: tuple[np.ndarray, np.ndarray],
                     after: tuple[np.ndarray, np.ndarray], M: int) -> tuple[np.ndarray, np.ndarray]:
    """What moves change on the links and (per-hop charge) on the devices, through the edges they touch.

    Args:
        blocks: the aggregated problem (``coef``: link seconds of a cut edge by (src, dst) device; ``dcoef``: the
            device seconds it charges both ends, or ``None``).
        e: ``[K]`` edge indices touched; em: ``[K]`` the move (0..M-1) each row belongs to.
        before, after: ``(src device, dst device)`` arrays ``[K]`` of each edge's ends without and with its move.
        M: number of moves.

    Returns:
        ``(device deltas [M, D], link deltas [M, D * D])`` in seconds per workload step.
    """
    D = blocks.cost.shape[1]
    (a0, b0), (a1, b1) = before, after
    dlink = np.bincount(em * D * D + a1 * D + b1, weights=np.where(a1 != b1, blocks.coef[e, a1, b1], 0.0),
                        minlength=M * D * D)
    dlink -= np.bincount(em * D * D + a0 * D + b0, weights=np.where(a0 != b0, blocks.coef[e, a0, b0], 0.0),
                         minlength=M * D * D)
    ddev = np.zeros(M * D)
    if blocks.dcoef is not None:  # the cut edges' device charges, on both ends, before and after the move
        dn = np.where(a1 != b1, blocks.dcoef[e, a1, b1], 0.0)
        do = np.where(a0 != b0, blocks.dcoef[e, a0, b0], 0.0)
        ddev += np.bincount(np.r_[em * D + a1, em * D + b1], weights=np.r_[dn, dn], minlength=M * D)
        ddev -= np.bincount(np.r_[em * D + a0, em * D + b0], weights=np.r_[do, do], minlength=M * D)
    return ddev.reshape(M, D), dlink.reshape(M, D * D)


def block_cycle_many(blocks: Blocks, bplaces: np.ndarray) -> np.ndarray:
    """Cycle times ``[P]`` of ``[P, B]`` block placements (each equal to :func:`block_cycle` of its row)."""
    dev, link = block_loads_many(blocks, bplaces)
    return np.maximum(dev.max(1), link.max(1))


def block_cycle(blocks: Blocks, bplace: np.ndarray) -> float:
    """Cycle time of a block placement (equals :func:`evaluate.cycle_seconds` of its expansion)."""
    return float(block_cycle_many(blocks, np.asarray(bplace)[None])[0])


def memory_binds(pb: Problem, blocks: Blocks) -> bool:
    """Whether some placement could break a memory budget: ``False`` when every resident buffer together with the
    activation reserve fits on each device and each shared pool (then no placement can overflow and memory checks
    can be skipped)."""
    if np.isinf(pb.budgets).all() and not len(pb.pool_budgets):
        return False
    return pb.memory_could_bind(float(blocks.res_bytes.sum()))


def block_memory_over(pb: Problem, blocks: Blocks, bplaces: np.ndarray) -> np.ndarray:
    """``[P, D]`` bool: the devices whose budget each of ``[P, B]`` block placements breaks (resident bytes +
    activation reserve, on devices it uses); every used member of a memory pool whose budget the members break
    together counts as over."""
    bplaces = np.asarray(bplaces, dtype=np.int64)
    P, D = bplaces.shape[0], pb.D
    if not memory_binds(pb, blocks):
        return np.zeros((P, D), dtype=bool)
    def compute() -> tuple[np.ndarray, np.ndarray]:  # (buffer, holder block) entries, once per Blocks
        sizes = [len(h) for h in blocks.res_holders]
        return (np.repeat(np.arange(len(sizes)), sizes),
                np.concatenate(blocks.res_holders) if sizes else np.zeros(0, np.int64))

    buf, hold = blocks.memo("held", compute)
    rows = np.arange(P)[:, None]
    on = np.zeros((P, len(blocks.res_bytes), D), dtype=bool)
    on[rows, buf[None], bplaces[:, hold]] = True
    used = np.einsum("prd,r->pd", on.astype(np.float64), blocks.res_bytes)
    dev_on = np.zeros((P, D), dtype=bool)
    dev_on[rows, bplaces] = True
    over = dev_on & (used + pb.reserve > pb.budgets * (1 + 1e-9))
    if len(pb.pool_budgets):
        pool = pb.pool_over(on, blocks.res_bytes, dev_on)  # [P, K]
        over |= dev_on & (pool.astype(np.float64) @ pb.pools.astype(np.float64) > 0)
    return over


def block_memory_ok_many(pb: Problem, blocks: Blocks, bplaces: np.ndarray) -> np.ndarray:
    """``[P]`` bool: whether each of ``[P, B]`` block placements fits the budgets (resident bytes + activation
    reserve on every used device)."""
    return ~block_memory_over(pb, blocks, bplaces).any(1)


def block_memory_ok(pb: Problem, blocks: Blocks, bplace: np.ndarray) -> bool:
    """Whether a block placement fits the budgets (resident bytes + activation reserve on every used device)."""
    return bool(block_memory_ok_many(pb, blocks, np.asarray(bplace)[None])[0])
