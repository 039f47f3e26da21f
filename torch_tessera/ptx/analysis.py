"""Which pointer parameters a kernel reads and writes, by data flow over its PTX.

Every register (and three abstract memory cells: shared, local, and "what was stored through parameter i") carries a
taint: a bit set of the pointer parameters its value may derive from (``P``), of the parameters through which it may
have been loaded (``L``), and of the shared/local/module-global address spaces. Taints flow forward through address
arithmetic and through memory until a fixpoint; the analysis is flow-insensitive (a register's taint is the union over
all its definitions), which over-approximates loops and register reuse, so it can only add accesses, never drop one.
Then each memory instruction is attributed to the parameters in its address's ``P`` bits:

- an address with no ``P`` bit that is not shared/local/module memory is *unattributed*: the kernel is
  :attr:`~torch_tessera.ptx.types.KernelAccess.indirect`, and the parameters whose loaded values form it hold pointers;
- an address with ``P`` and ``L`` bits has a data-dependent offset (gather/scatter);
- an opcode the analysis does not know that touches a ``P``-tainted register makes those parameters read-write, and is
  logged: never a silent read-only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from torch_tessera.ptx.parser import PTXFunction, parse_ptx

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"(?<![\w.$])[%A-Za-z_$][\w$]*")
_MEM = re.compile(r"\[([^\]]*)\]")

# Instruction kinds.
ALU, NOOP, LOAD, STORE, ATOMIC, COPY, STPARAM, UNKNOWN = range(8)

#: Opcodes (first dot-component) whose destination is a function of their sources and that touch no memory.
VALUE_OPS = frozenset("""
mov add sub mul mad mul24 mad24 sad div rem abs neg min max popc clz bfind fns brev bfe bfi bmsk szext dp4a dp2a and or
xor not cnot lop3 shf shl shr prmt cvt cvta selp slct set setp fma rcp sqrt rsqrt sin cos lg2 ex2 tanh copysign testp
shfl vote match redux activemask mma wgmma elect createpolicy isspacep addc subc madc getctarank mapa istypep movmatrix
""".split())

#: Opcodes that move no data a parameter's memory depends on: control flow, barriers, fences, prefetches, async-group
#: bookkeeping (the copies themselves are COPY), mbarrier operations on shared memory.
NOOP_OPS = frozenset("""
bra ret exit trap brkpt bar barrier fence membar mbarrier griddepcontrol setmaxnreg nanosleep pmevent prefetch prefetchu
applypriority call
""".split())

_SPACES = ("global", "shared", "local", "const", "param")


def classify(opcode: str) -> int:
    """The kind of an opcode (one of ``ALU``, ``NOOP``, ``LOAD``, ``STORE``, ``ATOMIC``, ``COPY``, ``STPARAM``,
    ``UNKNOWN``)."""
    head, _, rest = opcode.partition(".")
    if head in VALUE_OPS:
        if head == "wgmma" and not rest.startswith("mma_async"):
            return NOOP
        return ALU
    if head in ("ld", "ldu", "ldmatrix"):
        return ALU if rest.startswith("param") else LOAD
    if head in ("st", "stmatrix", "tensormap") and not rest.startswith("cp_fenceproxy"):
        return STPARAM if rest.startswith("param") else STORE
    if head in ("atom", "red"):
        return ATOMIC
    if head == "cp" or opcode.startswith("tensormap.cp_fenceproxy"):
        if rest.startswith(("async.commit_group", "async.wait_group", "async.wait_all", "async.bulk.commit_group",
                            "async.bulk.wait_group", "async.mbarrier", "async.bulk.prefetch")):
            return NOOP
        return COPY
    if head in NOOP_OPS:
        return NOOP
    return UNKNOWN


def _copy_spaces(opcode: str) -> tuple[str, str]:
    """(destination, source) state spaces of a copy: ``cp.async.ca.shared.global`` -> (shared, global)."""
    found = [m.split("::")[0] for m in opcode.split(".") if m.split("::")[0] in _SPACES]
    if len(found) >= 2:
        return found[0], found[1]
    return "shared", "global"


@dataclass
class _Param:
    reads: bool = False
    writes: bool = False
    atomic: bool = False
    data_dependent: bool = False
    indirect: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RawAccess:
    """Per PTX parameter index: the access facts the analysis found (see :class:`~torch_tessera.ptx.types.ParamAccess`).

    Attributes:
        params: one entry per ``.param`` (scalars stay untouched).
        indirect: an access whose address derives from no parameter exists.
        unknown: distinct unknown opcodes that touched pointer-derived registers.
        passes: number of fixpoint passes taken.
    """

    params: tuple
    indirect: bool
    unknown: tuple[str, ...]
    passes: int


class _Bits:
    """Bit layout of the taints of one function with ``n`` parameters."""

    def __init__(self, n: int):
        self.n = n
        self.P = (1 << n) - 1
        self.L_UNATTR = 1 << (2 * n)
        self.L = (self.P << n) | self.L_UNATTR
        self.SHARED = 1 << (2 * n + 1)
        self.LOCAL = 1 << (2 * n + 2)
        self.MODULE = 1 << (2 * n + 3)

    def params_of(self, taint: int) -> list[int]:
        p, out, i = taint & self.P, [], 0
        while p:
            if p & 1:
                out.append(i)
            p >>= 1
            i += 1
        return out


def _decode(fn: PTXFunction) -> list[tuple]:
    """Turn instructions into ``(kind, dsts, srcs, mem0, mem1, instr)`` tuples of register/symbol names.

    ``mem0``/``mem1`` are the names in the first/second memory operand's address (a tensor-map operand's coordinates
    are left out); for stores and atomics ``srcs`` are the stored values.
    """
    kinds: dict[str, int] = {}
    ops = []
    append = ops.append
    find = _TOKEN.findall
    for ins in fn.instrs:
        kind = kinds.get(ins.opcode)
        if kind is None:
            kind = kinds[ins.opcode] = classify(ins.opcode)
        if kind == NOOP:
            continue
        args = ins.args
        if kind == ALU:
            if args[:1] == "{" or "|" in args:
                cut = args.find("}") if args[:1] == "{" else args.find(",")
                append((ALU, find(args, 0, cut), find(args, cut), (), (), ins))
            else:
                toks = find(args)
                if len(toks) > 1:
                    append((ALU, toks[:1], toks[1:], (), (), ins))
            continue
        mems = _MEM.findall(args)
        if kind == UNKNOWN:
            append((UNKNOWN, (), find(args), [find(m) for m in mems], (), ins))
            continue
        if not mems:
            append((UNKNOWN, (), find(args), [], (), ins))
            continue
        addr0 = find(mems[0].split(",", 1)[0])
        if kind == COPY:
            addr1 = find(mems[1].split(",", 1)[0]) if len(mems) > 1 else []
            append((COPY, (), (), addr0, addr1, ins))
        elif kind == LOAD:
            append((LOAD, find(args, 0, args.find("[")), (), addr0, (), ins))
        else:  # STORE, ATOMIC, STPARAM: values come after the address
            append((kind, find(args, 0, args.find("[")), find(args, args.rfind("]") + 1), addr0, (), ins))
    return ops


class _Taints:
    """Taint state: a dict from register/symbol name to bits, plus the abstract memory cells."""

    def __init__(self, fn: PTXFunction, bits: _Bits):
        n = len(fn.params)
        self.bits = bits
        self.t: dict[str, int] = {}
        for p in fn.params:
            if p.is_pointer or p.is_tensormap:
                self.t[p.name] = 1 << p.index
        for names, bit in ((fn.shared_symbols, bits.SHARED), (fn.global_symbols, bits.MODULE),
                           (fn.local_symbols, bits.LOCAL)):
            for s in names:
                self.t[s] = bit
        self.cell_of = [f"<mem {i}>" for i in range(n)]
        self.lbit = [1 << (n + i) for i in range(n)]
        self.read_cells: set[str] = set()  # cells some load consulted in the current pass

    def of(self, names) -> int:
        get, v = self.t.get, 0
        for s in names:
            v |= get(s, 0)
        return v

    def load_value(self, a: int, space: str) -> int:
        """Taint of a value loaded from address taint ``a`` in state space ``space``."""
        b, t, v = self.bits, self.t, 0
        cells = [self.cell_of[i] for i in b.params_of(a)] if a & b.P else []
        for i in b.params_of(a):
            v |= self.lbit[i]
        if a & b.SHARED or space == "shared":
            cells.append("<shared>")
        if a & b.LOCAL or space == "local":
            cells.append("<local>")
        for c in cells:
            v |= t.get(c, 0)
        self.read_cells.update(cells)
        if not a & (b.P | b.SHARED | b.LOCAL | b.MODULE) and space not in ("shared", "local"):
            v |= b.L_UNATTR
        return v

    def store(self, a: int, space: str, v: int) -> bool:
        """Merge ``v`` into the cells address taint ``a`` may point to; whether a cell some load already consulted
        changed."""
        b, t, changed = self.bits, self.t, False
        cells = [self.cell_of[i] for i in b.params_of(a)] if a & b.P else []
        if a & b.SHARED or space == "shared":
            cells.append("<shared>")
        if a & b.LOCAL or space == "local":
            cells.append("<local>")
        for c in cells:
            old = t.get(c, 0)
            if old | v != old:
                t[c] = old | v
                changed |= c in self.read_cells
        return changed


def _space(opcode: str) -> str:
    for s in _SPACES:
        if "." + s in opcode:
            return s
    return "generic"


def _propagate(ops: list[tuple], st: _Taints, loop_start: int | None) -> int:
    """Run the flow-insensitive propagation to its fixpoint; returns the number of (partial) passes.

    Straight-line code converges in one pass, except where a memory cell grows after a load consulted it; then the
    pass reruns from the first cell-reading op. With loops, passes rerun from the first loop head while any
    register changes.
    """
    t = st.t
    get = t.get
    first_reader = next((j for j, op in enumerate(ops) if op[0] in (LOAD, ATOMIC, COPY)), len(ops))
    spaces: dict[str, str] = {}
    start, passes = 0, 0
    while start is not None:
        passes += 1
        rerun = None
        st.read_cells.clear()
        for j in range(start, len(ops)):
            kind, dsts, srcs, m0, m1, ins = ops[j]
            if kind == ALU or kind == UNKNOWN:
                v = 0
                for s in srcs:
                    v |= get(s, 0)
                for m in m0:
                    v |= st.of(m)
            else:
                op = ins.opcode
                space = spaces.get(op) or spaces.setdefault(op, _space(op))
                a = st.of(m0)
                v = 0
                if kind == LOAD or kind == ATOMIC:
                    v = st.load_value(a, space)
                cell_changed = False
                if kind == STORE or kind == ATOMIC:
                    cell_changed = st.store(a, space, st.of(srcs))
                elif kind == COPY:
                    dst_space, src_space = _copy_spaces(op)
                    cell_changed = st.store(a, dst_space, st.load_value(st.of(m1), src_space))
                if cell_changed:
                    rerun = first_reader if rerun is None else min(rerun, first_reader)
            if v:
                for d in dsts:
                    old = get(d, 0)
                    if old | v != old:
                        t[d] = old | v
                        if loop_start is not None and j >= loop_start:
                            rerun = loop_start if rerun is None else min(rerun, loop_start)
        start = rerun
    return passes


def analyze_function(fn: PTXFunction) -> RawAccess:
    """Run the taint analysis on a parsed entry. See the module docstring for the rules."""
    bits = _Bits(len(fn.params))
    ops = _decode(fn)
    st = _Taints(fn, bits)
    loop_start = None
    if fn.loop_heads:
        line = fn.instrs[min(fn.loop_heads)].line if min(fn.loop_heads) < len(fn.instrs) else 1 << 30
        loop_start = next((j for j, op in enumerate(ops) if op[5].line >= line), len(ops))
    passes = _propagate(ops, st, loop_start)
    return _attribute(fn, ops, st, passes)


def _attribute(fn: PTXFunction, ops: list[tuple], st: _Taints, passes: int) -> RawAccess:
    """With the taints at their fixpoint, attribute every memory access to parameters."""
    n, bits, t = len(fn.params), st.bits, st.t
    acc = [_Param() for _ in range(n)]
    P, L, ELSEWHERE = bits.P, bits.L, bits.SHARED | bits.LOCAL | bits.MODULE
    indirect = False
    unknown: set[str] = set()
    tensormap_mask = sum(1 << p.index for p in fn.params if p.is_tensormap)

    def touch(a: int, read: bool, write: bool, atomic: bool, ins) -> None:
        nonlocal indirect
        if a & P:
            for i in bits.params_of(a):
                acc[i].reads |= read
                acc[i].writes |= write
                acc[i].atomic |= atomic
                acc[i].data_dependent |= bool(a & L)
        elif not a & ELSEWHERE:
            indirect = True
            for i in bits.params_of(a >> n):
                acc[i].indirect = True
            log.info("%s line %d: address derives from no parameter: %s %s", fn.name, ins.line, ins.opcode, ins.args)

    def described(a: int) -> int:
        """Taint of the memory a tensor-map operand describes: the by-value descriptor param itself, or the pointers
        stored into the global memory that holds the descriptor (device-side descriptors)."""
        out = 0
        for i in bits.params_of(a):
            out |= (1 << i) if tensormap_mask >> i & 1 else t.get(st.cell_of[i], 0) & P
        return out

    for kind, dsts, srcs, m0, m1, ins in ops:
        if kind == ALU:
            continue
        op = ins.opcode
        if kind == UNKNOWN:
            v = st.of(srcs)
            if v & P:
                unknown.add(op)
                for i in bits.params_of(v):
                    acc[i].reads = acc[i].writes = True
                    acc[i].notes.append(f"line {ins.line}: unknown instruction {op}")
                log.warning("%s line %d: unknown instruction %r touches a pointer derived from parameter(s) %s; "
                            "treating them as read-write", fn.name, ins.line, op,
                            [fn.params[i].name for i in bits.params_of(v)])
            for m in m0:
                if not st.of(m) & (P | ELSEWHERE):
                    touch(st.of(m), True, True, False, ins)
            continue
        a = st.of(m0)
        if kind == STPARAM:
            for i in bits.params_of(st.of(srcs)):
                acc[i].reads = acc[i].writes = True
                acc[i].notes.append(f"line {ins.line}: pointer passed to a called function")
        elif kind == LOAD:
            touch(a, True, False, False, ins)
        elif kind == STORE:
            touch(a, False, True, False, ins)
        elif kind == ATOMIC:
            touch(a, True, True, True, ins)
        elif kind == COPY:
            b = st.of(m1)
            dst_space, src_space = _copy_spaces(op)
            tensor, reduce = ".tensor." in op, op.startswith("cp.reduce")
            if dst_space == "global":
                touch(described(a) if tensor else a, reduce, True, reduce, ins)
            if src_space == "global":
                touch(described(b) if tensor else b, True, False, False, ins)
            if tensor:  # a descriptor kept in global memory is itself read
                desc = (a if dst_space == "global" else b) & P & ~tensormap_mask
                if desc:
                    touch(desc, True, False, False, ins)
    return RawAccess(params=tuple(acc), indirect=indirect, unknown=tuple(sorted(unknown)), passes=passes)


def analyze_text(text: str, kernel: str | None = None) -> RawAccess:
    """Parse and analyse PTX text (convenience for tests and dumps)."""
    return analyze_function(parse_ptx(text, kernel))
