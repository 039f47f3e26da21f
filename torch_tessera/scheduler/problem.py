"""Compile a workload, its costs and the topology into flat arrays the solvers work on.

Kernels of all programs get one global index (programs concatenated, each in program order). Kernels that must share
a device are merged into *groups* (hard): every writer of a STATE buffer (its owner), every kernel the access analysis
is unsure of together with a DAG neighbour. Pins fix a group's device.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from torch_tessera.errors import ConfigError, InfeasiblePlanError
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.lowering.program import BufferKind
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.scheduler.types import Workload, WorkloadProgram

log = logging.getLogger(__name__)


@dataclass
class Resident:
    """A buffer that lives on every device where one of its holders runs (weights, inputs, state replicas)."""

    name: str
    kind: str  # "parameter" | "input" | "state"
    nbytes: int
    holders: np.ndarray  # kernel indices


class Memo:
    """Derived data computed once per object, by key (the object's arrays are not changed after construction)."""

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, called on the first request for ``key`` only; later calls return the same object."""
        store = self.__dict__.setdefault("_memo", {})
        if key not in store:
            store[key] = compute()
        return store[key]

    def adopt_memos(self, other: "Memo", keys: Sequence[str]) -> None:
        """Take ``other``'s memos of ``keys`` that this object has not computed: for derived data both compute
        alike (the caller's promise: ``other`` differs only in fields those memos do not read)."""
        mine = self.__dict__.setdefault("_memo", {})
        for k, v in other.__dict__.get("_memo", {}).items():
            if k in keys and k not in mine:
                mine[k] = v


@dataclass
class Problem(Memo):
    """Flat view of a planning problem (internal to the scheduler; arrays indexed by global kernel index).

    Edge arrays include STATE hand-over edges between programs (kind ``"STATE"``) and ordering-only edges
    (``ebytes == 0``). ``ewbytes``/``ewcount`` are per workload step: bytes times the program frequency, and transfers
    times frequency times micro-batches (each micro-batch pays the per-hop latency). ``hop`` / ``expose`` (``[D, D]``,
    from :attr:`Topology.hop_overhead` / :attr:`Topology.copy_exposure`) charge a cut edge on the two devices it joins
    (:meth:`device_coef`). ``pools`` (``[K, D]`` bool) and ``pool_budgets`` (``[K]`` bytes) are the memory devices
    share (SM partitions of one GPU, :attr:`Topology.memory_pools`): the resident bytes and activation reserves of
    the used members of pool ``k`` must fit ``pool_budgets[k]`` together; ``pool_names`` / ``pool_sources`` name the
    GPU and how its budget was set, for error messages.
    """

    devices: tuple[str, ...]
    programs: tuple[str, ...]
    roles: tuple[str, ...]
    freq: np.ndarray
    prog: np.ndarray
    launch: np.ndarray
    cost: np.ndarray
    names: list[str]
    op_class: list[str]
    layer: list[int | None]
    reads: list[frozenset]
    writes: list[frozenset]
    esrc: np.ndarray
    edst: np.ndarray
    ebytes: np.ndarray
    ewbytes: np.ndarray
    ewcount: np.ndarray
    ekind: list[str]
    eranges: list[tuple]
    group: np.ndarray
    pinned: np.ndarray
    resident: list[Resident]
    temp_bytes: list[dict[str, int]]
    reserve: float
    budgets: np.ndarray
    bw: np.ndarray
    alpha: np.ndarray
    micro_batches: int
    notes: list[str] = field(default_factory=list)
    streams: tuple[int, ...] = ()  # request stream of each program (Workload.replicated); () = all stream 0
    hop: np.ndarray | None = None
    expose: np.ndarray | None = None
    pools: np.ndarray | None = None
    pool_budgets: np.ndarray | None = None
    pool_names: tuple[str, ...] = ()
    pool_sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        D = len(self.devices)
        self.pools = np.zeros((0, D), dtype=bool) if self.pools is None else np.asarray(self.pools, dtype=bool)
        self.pool_budgets = (np.zeros(0) if self.pool_budgets is None
                             else np.asarray(self.pool_budgets, dtype=np.float64))
        self.hop = np.zeros((D, D)) if self.hop is None else np.asarray(self.hop, dtype=np.float64)
        self.expose = np.zeros((D, D)) if self.expose is None else np.asarray(self.expose, dtype=np.float64)

    @property
    def n(self) -> int:
        return len(self.prog)

    @property
    def D(self) -> int:
        return len(self.devices)

    @property
    def wcost(self) -> np.ndarray:
        """Seconds per workload step of each kernel on each device: ``cost * frequency``."""
        return self.cost * self.freq[self.prog][:, None]

    def program_slice(self, p: int) -> np.ndarray:
        return np.flatnonzero(self.prog == p)

    @property
    def hop_latency(self) -> np.ndarray:
        """``[D, D]`` seconds one cut edge adds to a run's critical path besides its bytes: the link's latency plus
        the topology's per-hop charge (:attr:`hop`; docs/BENCHMARKS.md, per-hop charge). Used by the latency policy;
        STATE hand-overs pay only ``alpha``."""
        return self.alpha + self.hop

    def link_coef(self) -> np.ndarray:
        """``[E, D, D]`` seconds each edge adds to link ``a -> b`` per workload step when cut that way."""
        with np.errstate(divide="ignore"):
            inv_bw = np.where(self.bw > 0, 1.0 / self.bw, np.inf)
        coef = self.ewbytes[:, None, None] * inv_bw[None] + self.ewcount[:, None, None] * self.alpha[None]
        coef[:, np.arange(self.D), np.arange(self.D)] = 0.0
        coef[(self.ewbytes <= 0)] = 0.0
        return coef

    def memory_could_bind(self, total: float) -> bool:
        """Whether some placement of ``total`` resident bytes could break a device budget or a pool's: ``False`` when
        they fit every device together with one activation reserve, and every pool with one per member."""
        tol = 1 + 1e-9
        if np.any(total + self.reserve * self.pools.sum(1) > self.pool_budgets * tol):
            return True
        return not np.isinf(self.budgets).all() and bool(np.any(total + self.reserve > self.budgets * tol))

    def pool_bytes(self, held: np.ndarray, nbytes: np.ndarray, dev_on: np.ndarray) -> np.ndarray:
        """``[P, K]`` bytes each pool's members hold together: every resident buffer held on any member once (the
        partitions of one GPU share one buffer pool at run time), plus one activation reserve per used member.

        Args:
            held: ``[P, R, D]`` bool, whether each of ``R`` resident buffers lives on each device.
            nbytes: ``[R]`` bytes of each buffer.
            dev_on: ``[P, D]`` bool, the devices each placement uses.
        """
        nbytes = np.asarray(nbytes, dtype=np.float64)
        held_bytes = np.stack([held[:, :, m].any(2) @ nbytes for m in self.pools], axis=1) if len(self.pools) else (
            np.zeros((len(dev_on), 0)))
        return held_bytes + self.reserve * (dev_on.astype(np.int64) @ self.pools.T.astype(np.int64))

    def pool_over(self, held: np.ndarray, nbytes: np.ndarray, dev_on: np.ndarray) -> np.ndarray:
        """``[P, K]`` bool: the pools whose budget the placements break (:meth:`pool_bytes`, same arguments)."""
        if not len(self.pool_budgets):
            return np.zeros((len(dev_on), 0), dtype=bool)
        return self.pool_bytes(held, nbytes, dev_on) > self.pool_budgets * (1 + 1e-9)

    @property
    def charges_devices(self) -> bool:
        """Whether a cut edge costs the devices it joins anything (:meth:`device_coef` not all zero)."""
        return bool((self.hop > 0).any() or (self.expose > 0).any())

    def device_coef(self) -> np.ndarray:
        """``[E, D, D]`` seconds each edge adds per workload step to EACH of the devices ``a`` and ``b`` when cut
        ``a -> b``: ``ewcount x hop[a, b] + ewbytes x expose[a, b] / bandwidth[a, b]`` (zero on the diagonal and for
        edges that carry no bytes). On two devices every cut edge has one end on each, so this adds to the cycle
        time whichever device binds.

        STATE hand-overs between programs (one copy per workload step, outside both programs' runs) are left out:
        the charge describes cut edges inside a program's run (``bench/fit_hop_overhead.py``; docs/BENCHMARKS.md,
        per-hop charge)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            inv_bw = np.where(self.bw > 0, 1.0 / self.bw, np.inf)
            exposed = np.where(self.expose > 0, self.expose * inv_bw, 0.0)
        coef = self.ewcount[:, None, None] * self.hop[None] + self.ewbytes[:, None, None] * exposed[None]
        coef[:, np.arange(self.D), np.arange(self.D)] = 0.0
        coef[(self.ewbytes <= 0) | (np.array(self.ekind, dtype=object) == "STATE")] = 0.0
        return coef


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def labels(self) -> np.ndarray:
        """Component of each element, numbered in the order of the components' least elements."""
        root = np.array(self.parent, dtype=np.int64)
        while True:  # pointer jumping: every element ends at its root (a root is its own parent)
            up = root[root]
            if np.array_equal(up, root):
                break
            root = up
        _, lab = np.unique(root, return_inverse=True)
        return lab.astype(np.int64)


def as_workload(dag_or_workload: DependencyGraph | Workload,
                costs: CostTable | Mapping[str, CostTable] | None) -> Workload:
    """Wrap a single DAG as a one-program workload and attach cost tables passed separately."""
    wl = dag_or_workload if isinstance(dag_or_workload, Workload) else Workload.single(dag_or_workload)
    progs = []
    for p in wl.programs:
        c = p.costs
        if isinstance(costs, CostTable):
            c = costs if len(wl.programs) == 1 else c
        elif isinstance(costs, Mapping):
            c = costs.get(p.name, c)
        if c is None:
            raise ConfigError(f"no cost table for program {p.name!r}: pass costs=CostTable (one program) or "
                              f"costs={{name: CostTable}}, or set WorkloadProgram.costs")
        progs.append(WorkloadProgram(p.name, p.dag, c, p.frequency, p.role, p.stream))
    return Workload(tuple(progs), tie_state=wl.tie_state)


def _cost_matrix(p: WorkloadProgram, devices: tuple[str, ...], nodes: list[int]) -> np.ndarray:
    c = p.costs
    if set(c.devices) != set(devices):
        raise ConfigError(f"cost table of {p.name!r} covers devices {c.devices}, topology has {devices}; "
                          f"profile or model the same device set")
    cols = [c.devices.index(d) for d in devices]
    index = c.kernel_index
    missing = [k for k in nodes if k not in index]
    if missing:
        raise ConfigError(f"cost table of {p.name!r} lacks launches {missing[:5]} ({len(missing)} missing); "
                          f"rebuild it from this program")
    rows = np.array([index[k] for k in nodes], dtype=np.int64)
    return c.seconds[rows][:, cols].astype(np.float64)


def _budgets(topology: Topology, memory_budgets, devices: tuple[str, ...]) -> np.ndarray:
    if memory_budgets is None:
        memory_budgets = topology.memory or None
    if memory_budgets is None:
        return np.full(len(devices), np.inf)
    if isinstance(memory_budgets, Mapping):
        unknown = set(memory_budgets) - set(devices)
        if unknown:
            raise ConfigError(f"memory_budgets names unknown devices {sorted(unknown)}; devices are {devices}")
        vals = [memory_budgets.get(d) for d in devices]
    else:
        vals = list(memory_budgets)
        if len(vals) != len(devices):
            raise ConfigError(f"memory_budgets has {len(vals)} entries for {len(devices)} devices {devices}")
    return np.array([np.inf if v is None else float(v) for v in vals])


def _pools(topology: Topology, memory_budgets, D: int) -> dict:
    """``Problem``'s pool fields from :attr:`Topology.memory_pools`; none when ``memory_budgets`` is given (budgets
    the caller sets win over the devices' memory, shared or not)."""
    pools = topology.memory_pools if memory_budgets is None else ()
    mask = np.zeros((len(pools), D), dtype=bool)
    for k, pool in enumerate(pools):
        mask[k, list(pool.members)] = True
    return dict(pools=mask, pool_budgets=np.array([float(p.capacity) for p in pools]),
                pool_names=tuple(p.name for p in pools), pool_sources=tuple(p.source for p in pools))


def compile_problem(wl: Workload, topology: Topology, *, memory_budgets=None, pins=None,
                    micro_batches: int = 1) -> Problem:
    """Flatten ``wl`` into a :class:`Problem` (see module docstring)."""
    devices = tuple(topology.devices)
    D = len(devices)
    if D < 1:
        raise ConfigError("topology has no devices")
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")
    prog, launch, costs, names, ocls, layers, reads, writes, unsure = [], [], [], [], [], [], [], [], []
    index: dict[tuple[int, int], int] = {}
    local: list[dict[int, int]] = []  # per program: launch index -> global kernel index
    for pi, p in enumerate(wl.programs):  # comprehensions, not appends: this runs over every launch of every call
        records = p.dag.nodes()
        nodes = [r.index for r in records]
        costs.append(_cost_matrix(p, devices, nodes))
        local.append({k: len(prog) + i for i, k in enumerate(nodes)})
        index.update({(pi, k): i for k, i in local[-1].items()})
        prog += [pi] * len(nodes)
        launch += nodes
        rows = [(r.name, r.op_class, r.layer, r.reads, r.writes, r.unsure) for r in records]
        for out, col in zip((names, ocls, layers, reads, writes, unsure), zip(*rows) if rows else [()] * 6):
            out += col
    n = len(prog)
    freq = np.array([float(p.frequency) for p in wl.programs])
    if (freq <= 0).any():
        raise ConfigError(f"program frequencies must be > 0, got {freq.tolist()}")
    prog_a = np.array(prog, dtype=np.int64)

    esrc, edst, ebytes, eranges = [], [], [], []
    for pi, p in enumerate(wl.programs):
        at = local[pi]
        # the order of graph.edges(data=True), without its views
        rows = [(at[u], at[v], int(d.get("bytes", 0)) if "RAW" in d.get("kinds", ()) else 0,
                 tuple(d.get("ranges", ()))) for u, nbrs in p.dag.graph.adjacency() for v, d in nbrs.items()]
        for out, col in zip((esrc, edst, ebytes, eranges), zip(*rows) if rows else [()] * 4):
            out += col
    ekind = ["RAW" if b else "ORDER" for b in ebytes]
    eb = np.array(ebytes, dtype=np.float64)
    efreq = freq[prog_a[np.array(esrc, dtype=np.int64)]] if esrc else np.zeros(0)
    ewbytes, ewcount = eb * efreq, np.where(eb != 0, efreq * micro_batches, 0.0)

    uf = _UnionFind(n)
    touch = [r | w for r, w in zip(reads, writes)]
    resident, handovers, temp_bytes, temps = _buffers(wl, touch, writes, prog, uf, (esrc, ebytes, eranges))
    for (s, t, nbytes, name) in handovers:
        esrc.append(s), edst.append(t), ebytes.append(nbytes), ekind.append("STATE")
        eranges.append(((name, 0, nbytes),))
    hb = np.array([float(h[2]) for h in handovers])
    ewbytes, ewcount = np.r_[ewbytes, hb], np.r_[ewcount, np.ones(len(hb))]

    notes = []
    n_unsure = _keep_unsure_with_neighbour(unsure, esrc, edst, ebytes, uf)
    if n_unsure:
        notes.append(f"{n_unsure} unsure kernel(s) kept with a DAG neighbour")
    group = uf.labels()
    pinned = _apply_pins(pins, wl, index, group, devices)

    reserve = max(live_peak(np.flatnonzero(prog_a == pi), temps, n) for pi in range(len(wl.programs)))
    pb = Problem(
        devices=devices, programs=tuple(p.name for p in wl.programs), roles=tuple(p.role for p in wl.programs),
        freq=freq, prog=prog_a, launch=np.array(launch, dtype=np.int64), cost=np.vstack(costs),
        names=names, op_class=ocls, layer=layers, reads=reads, writes=writes,
        esrc=np.array(esrc, dtype=np.int64), edst=np.array(edst, dtype=np.int64),
        ebytes=np.array(ebytes, dtype=np.float64), ewbytes=np.asarray(ewbytes, dtype=np.float64),
        ewcount=np.asarray(ewcount, dtype=np.float64), ekind=ekind, eranges=eranges,
        group=group, pinned=pinned, resident=resident, temp_bytes=temp_bytes, reserve=float(reserve),
        budgets=_budgets(topology, memory_budgets, devices), bw=np.asarray(topology.bandwidth, dtype=np.float64),
        alpha=np.asarray(topology.latency, dtype=np.float64), micro_batches=int(micro_batches), notes=notes,
        streams=tuple(p.stream for p in wl.programs),
        hop=_pair_matrix(topology, "hop_overhead", D), expose=_pair_matrix(topology, "copy_exposure", D),
        **_pools(topology, memory_budgets, D))
    pb.memo("temps", lambda: temps)  # for evaluate.memory's per-device peaks
    return pb


def _pair_matrix(topology: Topology, name: str, D: int) -> np.ndarray:
    """``topology.<name>`` as a ``[D, D]`` float array (zeros when the topology has none)."""
    v = getattr(topology, name, None)
    return np.zeros((D, D)) if v is None else np.asarray(v, dtype=np.float64).reshape(D, D)


def _written_bytes(esrc, ebytes, eranges, prog, names: set[str] | frozenset[str]) -> dict[tuple[int, str], int]:
    """Per (program, buffer) for the buffers in ``names``: length of the union of the byte ranges its RAW edges carry
    (what the program wrote and then read back), e.g. the prompt's rows of a KV cache in a prefill program."""
    spans: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for s, b, rs in zip(esrc, ebytes, eranges):
        if b:
            for name, lo, hi in rs:
                if name in names:
                    spans.setdefault((prog[s], name), []).append((lo, hi))
    out = {}
    for key, iv in spans.items():
        total, end = 0, None
        for lo, hi in sorted(iv):
            if end is None or lo > end:
                total += hi - lo
                end = hi
            elif hi > end:
                total += hi - end
                end = hi
        out[key] = total
    return out


#: Code of a touched name that is not in its program's buffer table (skipped).
_UNKNOWN = 2 ** 62


def _buffers(wl: Workload, touch, writes, prog, uf: _UnionFind, edges: tuple[list, list, list]):
    """Resident buffers (weights, inputs, state) with their holder kernels; STATE owners merged; hand-over edges;
    and the TEMP buffers each kernel touches (:func:`temp_entries`' arrays and the programs' TEMP tables).

    A STATE buffer written by program p and used by the next program q that uses it is handed over once per workload
    step from p's owner to q's owner (q's first reader if q does not write it). The bytes are what p's RAW edges show
    it wrote (the whole buffer when unknown; ``edges`` = the program edges' ``(sources, bytes, ranges)``). Readers of
    the state in q on a third device get only q's deltas: their copy of p's part is not priced (a known undercount).

    Every kernel's touched buffers are read once, as codes: a resident buffer's index by name (shared by the programs),
    or ``-1 - i`` for the program's ``i``-th TEMP buffer (numbered program by program, as :func:`temp_entries`).

    Request streams (:meth:`Workload.replicated`): a STATE or INPUT buffer of a program of stream ``r >= 1`` is the
    resident buffer ``"<name>@<r>"`` (each stream has its own state and inputs); weights stay shared by name."""
    TEMP, STATE, PARAM = BufferKind.TEMP, BufferKind.STATE, BufferKind.PARAMETER
    temp_bytes: list[dict[str, int]] = []
    rid: dict[str, int] = {}
    raw: dict[str, str] = {}  # resident name -> the programs' buffer name (they differ for streams >= 1)
    info: list[dict[str, tuple[str, int, bool]]] = []  # per program: resident name -> (kind, bytes, is STATE)
    code: list[dict[str, int]] = []
    offset = 0
    for p in wl.programs:
        tb, mine, key = {}, {}, {}
        stream = p.stream
        for nm, b in p.dag.buffers.items():  # (the enum's _value_: its .value property is slow in a loop)
            if b.kind is TEMP:
                tb[b.name] = b.nbytes
            else:
                k = nm
                if stream and b.kind is not PARAM:  # each request stream has its own state and inputs
                    k = f"{nm}@{stream}"
                    raw[k] = nm
                key[nm] = k
                mine[k] = (b.kind.value, int(b.nbytes), b.kind is STATE)
        temp_bytes.append(tb)
        info.append(mine)
        c = {nm: rid.setdefault(k, len(rid)) for nm, k in key.items()}
        c.update({nm: -1 - offset - i for i, nm in enumerate(tb)})
        code.append(c)
        offset += len(tb)
    names = list(rid)
    # one pass over every (kernel, buffer it touches), in kernel order, with the loops in C (map, chain, fromiter);
    # a program's kernels are contiguous
    prog_a = np.asarray(prog, dtype=np.int64)
    ker, cod = [], []
    for p in range(len(wl.programs)):
        lo, hi = np.searchsorted(prog_a, [p, p + 1]).tolist()
        lens = list(map(len, touch[lo:hi]))
        ker.append(np.repeat(np.arange(lo, hi), lens))
        cod.append(np.fromiter(map(code[p].get, itertools.chain.from_iterable(touch[lo:hi]),
                                   itertools.repeat(_UNKNOWN)), dtype=np.int64, count=sum(lens)))
    ker, cod = np.concatenate(ker), np.concatenate(cod)  # (a workload has at least one program)
    known = cod != _UNKNOWN  # a name the program's buffer table lacks
    ker, cod = ker[known], cod[known]
    tmp = cod < 0
    temps = (ker[tmp], -1 - cod[tmp], np.array([v for t in temp_bytes for v in t.values()], dtype=np.float64))
    res = np.flatnonzero(~tmp)
    res = res[np.argsort(cod[res], kind="stable")]  # by resident buffer, each one's holders in kernel order
    cuts = np.r_[0, np.cumsum(np.bincount(cod[res], minlength=len(names)))].tolist()
    held = ker[res]
    held_by = held.tolist()
    held_arrays = [held[a:b] for a, b in zip(cuts[:-1], cuts[1:])]  # np.split's pieces, without its per-piece calls
    holders: dict[str, list[int]] = {}
    kinds: dict[str, tuple[str, int]] = {}
    state_writers: dict[tuple[int, str], list[int]] = {}
    state_access: dict[tuple[int, str], list[int]] = {}
    state_progs: dict[str, set[int]] = {}
    single = len(wl.programs) == 1
    for r, name in enumerate(names):
        ks = held_by[cuts[r]:cuts[r + 1]]
        if not ks:
            continue
        holders[name] = ks
        progs = [0] if single else sorted({prog[k] for k in ks})
        # the kind where it is first touched, the largest size among the programs touching it
        kinds[name] = (info[prog[ks[0]]][name][0], max(info[q][name][1] for q in progs))
        if any(info[q][name][2] for q in progs):
            for k in ks:
                if info[prog[k]][name][2]:
                    state_access.setdefault((prog[k], name), []).append(k)
                    state_progs.setdefault(name, set()).add(prog[k])
                    if raw.get(name, name) in writes[k]:
                        state_writers.setdefault((prog[k], name), []).append(k)
    # a RAW range of a STATE buffer leaves one of its writers: only their out-edges are read
    esrc, ebytes, eranges = edges
    writer = np.zeros(len(prog), dtype=bool)
    writer[[k for ks in state_writers.values() for k in ks]] = True
    sel = np.flatnonzero(writer[np.asarray(esrc, dtype=np.int64)]).tolist() if len(esrc) else []
    written = _written_bytes([esrc[e] for e in sel], [ebytes[e] for e in sel], [eranges[e] for e in sel], prog,
                             {raw.get(nm, nm) for (_, nm) in state_writers})
    for ks in state_writers.values():
        for k in ks[1:]:
            uf.union(ks[0], k)
    handovers = []
    for name in sorted({nm for (_, nm) in state_writers}):  # sorted: plans must not depend on hash seeds
        progs = sorted(state_progs[name])
        for p, q in zip(progs, progs[1:]):
            src = state_writers.get((p, name))
            if not src:
                continue
            if wl.tie_state and (q, name) in state_writers:
                uf.union(src[0], state_writers[(q, name)][0])
                continue
            dst = state_writers.get((q, name)) or state_access[(q, name)]
            handovers.append((src[0], dst[0], written.get((p, raw.get(name, name)), kinds[name][1]), name))
    resident = [Resident(nm, kinds[nm][0], kinds[nm][1], held_arrays[rid[nm]])  # holders: ascending, distinct
                for nm in sorted(holders)]
    return resident, handovers, temp_bytes, temps


def _keep_unsure_with_neighbour(unsure, esrc, edst, ebytes, uf: _UnionFind) -> int:
    """Merge each unsure kernel with the predecessor it reads most bytes from (else its heaviest successor)."""
    if not any(unsure):
        return 0
    count = 0
    best_in: dict[int, tuple[float, int]] = {}
    best_out: dict[int, tuple[float, int]] = {}
    for s, t, b in zip(esrc, edst, ebytes):
        if unsure[t] and (t not in best_in or b > best_in[t][0]):
            best_in[t] = (b, s)
        if unsure[s] and (s not in best_out or b > best_out[s][0]):
            best_out[s] = (b, t)
    for k, u in enumerate(unsure):
        if not u:
            continue
        nb = best_in.get(k) or best_out.get(k)
        if nb is not None:
            uf.union(k, nb[1])
            count += 1
    return count


def _apply_pins(pins, wl: Workload, index, group: np.ndarray, devices: tuple[str, ...]) -> np.ndarray:
    pinned = np.full(int(group.max()) + 1 if len(group) else 0, -1, dtype=np.int64)
    by_group: dict[int, tuple[int, object]] = {}
    for key, dev in (pins or {}).items():
        if isinstance(key, tuple):
            pname, launch = key
            names = [p.name for p in wl.programs]
            if pname not in names:
                raise ConfigError(f"pin {key!r} names unknown program {pname!r}; programs are {names}")
            pi = names.index(pname)
        elif len(wl.programs) == 1:
            pi, launch = 0, key
        else:
            raise ConfigError(f"pin {key!r}: with several programs pin by (program, launch index)")
        if (pi, launch) not in index:
            raise ConfigError(f"pin {key!r} names no launch of program {wl.programs[pi].name!r}")
        d = devices.index(dev) if isinstance(dev, str) and dev in devices else dev
        if not isinstance(d, (int, np.integer)) or not 0 <= d < len(devices):
            raise ConfigError(f"pin {key!r} -> {dev!r}: not a device index or name of {devices}")
        g = int(group[index[(pi, launch)]])
        if g in by_group and by_group[g][0] != d:
            raise InfeasiblePlanError(
                f"pins {by_group[g][1]!r} -> {devices[by_group[g][0]]} and {key!r} -> {devices[d]} conflict: the two "
                f"launches must share a device (same STATE owner or an unsure kernel's neighbour); pin them alike")
        by_group[g] = (int(d), key)
        pinned[g] = d
    return pinned


def _temp_peak(kernels: Sequence[int], reads, writes, temp: dict[str, int]) -> int:
    """Peak bytes of live TEMP buffers when ``kernels`` run in order on one device (live from first to last touch)."""
    return _live_peak(range(len(kernels)), [reads[k] | writes[k] for k in kernels], temp)


def _live_peak(kernels: Sequence[int], touch: Sequence[frozenset], temp: dict[str, int]) -> int:
    """:func:`_temp_peak` with each kernel's buffers given as ``touch[k]`` (reads and writes)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for pos, k in enumerate(kernels):
        for b in touch[k]:
            if b in temp:
                first.setdefault(b, pos)
                last[b] = pos
    if not first:
        return 0
    delta = np.zeros(len(kernels) + 1)
    for b, f in first.items():
        delta[f] += temp[b]
        delta[last[b] + 1] -= temp[b]
    return int(np.cumsum(delta).max())


def temp_entries(touch: Sequence[frozenset], temp_bytes: Sequence[dict[str, int]],
                 prog: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The TEMP buffers each kernel touches, as arrays for :func:`live_peak`.

    Args:
        touch: per kernel (global index) the names of the buffers it reads or writes.
        temp_bytes: per program its TEMP buffers' bytes by name.
        prog: program of each kernel.

    Returns:
        ``(kernel, buffer, nbytes)``: one entry per (kernel, TEMP buffer it touches), in kernel order; buffers are
        numbered per (program, name); ``nbytes[buffer]`` is the buffer's size in bytes.
    """
    ids, keys, size = [], [], []
    for t in temp_bytes:  # numbered program by program, in the order of its table
        ids.append({name: len(size) + i for i, name in enumerate(t)})
        keys.append(frozenset(t))
        size += list(t.values())
    ker, buf = [], []
    for k, names in enumerate(touch):
        p = prog[k]
        got = [ids[p][name] for name in names & keys[p]]
        ker += [k] * len(got)
        buf += got
    return np.array(ker, dtype=np.int64), np.array(buf, dtype=np.int64), np.array(size, dtype=np.float64)


def live_peak(kernels: np.ndarray, entries: tuple[np.ndarray, np.ndarray, np.ndarray], n: int) -> int:
    """Peak bytes of live TEMP buffers when ``kernels`` (ascending global indices of one program) run in that order
    on one device, each buffer live from its first to its last touch among them: :func:`_live_peak` over the arrays of
    :func:`temp_entries` (``n`` kernels in the problem). Sizes are whole bytes, so the float sums are exact."""
    ker, buf, size = entries
    if not len(kernels) or not len(ker):
        return 0
    rank = np.full(n, -1, dtype=np.int64)
    rank[kernels] = np.arange(len(kernels))
    pos = rank[ker]
    sel = pos >= 0
    pos, b = pos[sel], buf[sel]
    if not len(b):
        return 0
    o = np.argsort(b, kind="stable")  # by buffer, each buffer's touches still in kernel order
    b, pos = b[o], pos[o]
    first = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    last = np.r_[first[1:], len(b)] - 1
    used = size[b[first]]
    delta = np.bincount(pos[first], weights=used, minlength=len(kernels) + 1)
    delta -= np.bincount(pos[last] + 1, weights=used, minlength=len(kernels) + 1)
    return int(np.cumsum(delta).max())
