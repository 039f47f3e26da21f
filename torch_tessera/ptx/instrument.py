"""Instrument Triton's PTX to observe the addresses each global memory instruction touches.

This is the check the Tessera paper makes of its static extents: run the kernel with every global access also
recording, into an extra buffer, the smallest and largest address it used. :func:`instrument_ptx` rewrites PTX so
that before each traced instruction (``ld.global``/``ld`` generic, ``st.global``, ``atom``, ``red``, the global source
of ``cp.async``) two reductions run under the *same predicate*::

    @%p1 red.global.min.u64  [%tss0+16*k],   addr;
    @%p1 red.global.max.u64  [%tss0+16*k+8], addr;

where ``%tss0`` holds the trace buffer (a new last ``.param``) and ``k`` numbers the instruction (its *site*). The
host fills slot ``k`` with ``(2**64 - 1, 0)`` before the launch; after it, :func:`decode_trace` turns the slots into
observed half-open address ranges (the largest address plus the access width). A site whose predicate was never true
keeps its initial values and is reported as not executed. Tensor-map copies (``cp.async.bulk.tensor``) carry no
address and are listed as untraced.

Every thread of a site hits the same two words, so the instrumented kernel is slow; it is meant for small validation
launches, not for timing. The rewrite keeps every original line; the instrumented PTX still parses with
:func:`torch_tessera.ptx.parser.parse_ptx` and is accepted by ``ptxas`` for sm_80 and sm_90a.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Sequence

from torch_tessera.errors import TesseraError
from torch_tessera.ptx.parser import Instr, parse_ptx

log = logging.getLogger(__name__)

#: Bytes of trace buffer per site: a ``u64`` minimum address, then a ``u64`` maximum address.
SLOT_BYTES = 16
U64_MAX = (1 << 64) - 1

_SPACES = {"global", "shared", "local", "const", "param", "tex"}
_TYPE = re.compile(r"^(?:b|u|s|f|bf|e4m3|e5m2)(\d+)(?:x(\d+))?$")
_ADDRESS = re.compile(r"^\[\s*(%?[\w$]+)\s*(?:\+\s*(-?(?:0x[0-9a-fA-F]+|\d+)))?\s*\]$")
_REG64 = re.compile(r"\.reg\s+\.[bsu]64\s+([^;]+);")
_NTID = re.compile(r"^\s*\.(?:reqntid|maxntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


class InstrumentError(TesseraError):
    """PTX could not be instrumented (a layout Triton does not emit). The message names the kernel and the line."""


@dataclass(frozen=True)
class TraceSite:
    """One traced memory instruction.

    Attributes:
        index: slot number in the trace buffer (bytes ``[16*index, 16*index + 16)``).
        line: 1-based line of the instruction in the original PTX.
        opcode: full opcode, e.g. ``ld.global.v2.b32``.
        kind: ``"load"``, ``"store"`` or ``"atomic"`` (read-modify-write).
        width: bytes one thread's access covers at the recorded address (vector count x element size).
        pred: the guard predicate copied onto the trace reductions, or ``None``.
    """

    index: int
    line: int
    opcode: str
    kind: str
    width: int
    pred: str | None

    @property
    def reads(self) -> bool:
        return self.kind in ("load", "atomic")

    @property
    def writes(self) -> bool:
        return self.kind in ("store", "atomic")


@dataclass(frozen=True)
class UntracedSite:
    """A global memory instruction the rewrite could not trace, and why (its accesses are not observed)."""

    line: int
    opcode: str
    reason: str


@dataclass(frozen=True)
class InstrumentedPTX:
    """PTX rewritten to record the address range of each global access.

    Attributes:
        kernel: entry name.
        ptx: the instrumented PTX text.
        trace_param: PTX name of the added last parameter (a ``.u64 .ptr .global``): the trace buffer.
        trace_param_index: its position (= number of original params).
        sites: traced instructions, by slot.
        untraced: global memory instructions left untraced.
        block: threads per block ``(x, y, z)`` from ``.reqntid``/``.maxntid``, or ``None`` if the PTX has neither.
    """

    kernel: str
    ptx: str
    trace_param: str
    trace_param_index: int
    sites: tuple[TraceSite, ...]
    untraced: tuple[UntracedSite, ...]
    block: tuple[int, int, int] | None

    @property
    def trace_nbytes(self) -> int:
        """Size of the trace buffer to pass, in bytes (at least one slot, so the buffer is never empty)."""
        return SLOT_BYTES * max(1, len(self.sites))

    def initial_trace(self) -> list[int]:
        """The ``u64`` words to fill the trace buffer with before the launch: ``(2**64 - 1, 0)`` per slot."""
        return [U64_MAX, 0] * max(1, len(self.sites))


@dataclass(frozen=True)
class ObservedSite:
    """The addresses one site touched during a launch: ``[start, end)`` in bytes, absolute device addresses."""

    site: TraceSite
    start: int
    end: int


def _width(opcode: str) -> int | None:
    parts = opcode.split(".")
    vec = next((int(p[1:]) for p in parts if p in ("v2", "v4", "v8")), 1)
    for p in reversed(parts):
        m = _TYPE.match(p)
        if m:
            return vec * int(m.group(1)) * int(m.group(2) or 1) // 8
    return None


def _kind(ins: Instr) -> tuple[str | None, int]:
    """``(kind, which bracket operand holds the global address)`` of a traced instruction; kind ``None``: not
    a global access; kind ``"untraced"``: a global access this rewrite cannot trace."""
    parts = ins.opcode.split(".")
    head, spaces = parts[0], _SPACES.intersection(parts)
    generic_or_global = not spaces or spaces == {"global"}
    if head in ("ld", "ldu") and generic_or_global:
        return "load", 0
    if head == "st" and generic_or_global:
        return "store", 0
    if head in ("atom", "red") and generic_or_global:
        return "atomic", 0
    if head == "cp" and "global" in parts:
        if "bulk" in parts or "tensor" in parts or "reduce" in parts:
            return "untraced", 0
        return "load", 1  # cp.async.{ca,cg}.shared.global [dst], [src], size
    if head == "multimem":
        return "untraced", 0
    return None, 0


def _reg64(text: str) -> set[str]:
    names = set()
    for decl in _REG64.findall(text):
        for name in decl.split(","):
            names.add(re.sub(r"<\d+>$", "", name.strip()))
    return names


def _is_reg64(token: str, reg64: set[str]) -> bool:
    return token in reg64 or re.sub(r"\d+$", "", token) in reg64


def _fresh_prefix(text: str) -> str:
    prefix = "%tss"
    while prefix in text:
        prefix += "_"
    return prefix


def instrument_ptx(ptx: str, kernel: str | None = None) -> InstrumentedPTX:
    """Rewrite ``ptx`` so that each global access records its address range in an added trace-buffer parameter.

    Args:
        ptx: PTX text with one ``.entry`` (as Triton emits it).
        kernel: name for messages (default: the entry's name).

    Returns:
        The instrumented PTX with its site table.

    Raises:
        PTXParseError: the input is malformed.
        InstrumentError: the entry has no parameter list or body layout this rewrite understands.
    """
    fn = parse_ptx(ptx, kernel)
    who = kernel or fn.name
    lines = ptx.split("\n")
    reg64 = _reg64(ptx)
    prefix = _fresh_prefix(ptx)
    base, value = f"{prefix}0", f"{prefix}1"
    trace = f"{fn.name}_param_{len(fn.params)}"
    if any(p.name == trace for p in fn.params):
        raise InstrumentError(f"kernel {who}: a parameter is already named {trace}")

    sites: list[TraceSite] = []
    untraced: list[UntracedSite] = []
    before: dict[int, list[tuple[Instr, list[str]]]] = {}  # line -> instructions on it and the lines to put first
    for ins in fn.instrs:
        kind, which = _kind(ins)
        if kind is None:
            continue
        addresses = [op for op in ins.operands if op.startswith("[")]
        width = _width(ins.opcode) if which == 0 else _int(ins.operands[2] if len(ins.operands) > 2 else "")
        m = _ADDRESS.match(addresses[which]) if len(addresses) > which else None
        reason = None
        if kind == "untraced":
            reason = "tensor-map or bulk copy: no per-thread address"
        elif m is None or not _is_reg64(m.group(1), reg64):
            reason = f"address operand {addresses[which] if len(addresses) > which else '?'} is not [64-bit reg+imm]"
        elif width is None:
            reason = "access width not known from the opcode"
        if reason:
            untraced.append(UntracedSite(ins.line, ins.opcode, reason))
            log.info("%s line %d: %s left untraced: %s", who, ins.line, ins.opcode, reason)
            continue
        site = TraceSite(len(sites), ins.line, ins.opcode, kind, width, ins.pred)
        sites.append(site)
        reg, offset = m.group(1), int(m.group(2) or "0", 0)
        guard = f"@{ins.pred} " if ins.pred else ""
        code = []
        if offset:
            code.append(f"\tadd.s64 \t{value}, {reg}, {offset};")
            reg = value
        slot = SLOT_BYTES * site.index
        code.append(f"\t{guard}red.global.min.u64 \t[{base}+{slot}], {reg};")
        code.append(f"\t{guard}red.global.max.u64 \t[{base}+{slot + 8}], {reg};")
        before.setdefault(ins.line, []).append((ins, code))

    out = _rewrite(lines, fn, who, before, trace, prefix)
    return InstrumentedPTX(kernel=fn.name, ptx="\n".join(out), trace_param=trace, trace_param_index=len(fn.params),
                           sites=tuple(sites), untraced=tuple(untraced), block=_block(lines))


def _int(text: str) -> int | None:
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def _block(lines: Sequence[str]) -> tuple[int, int, int] | None:
    for line in lines:
        m = _NTID.match(line)
        if m:
            return int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1)
    return None


def _rewrite(lines: list[str], fn, who: str, before: dict, trace: str, prefix: str) -> list[str]:
    """The instrumented text: trace param declared, trace base loaded, reductions before each traced line."""
    entry = next((i for i, line in enumerate(lines) if re.match(rf"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+"
                                                                rf"{re.escape(fn.name)}\b", line)), None)
    close = next((i for i in range(entry + 1, len(lines)) if lines[i].strip().startswith(")")), None) \
        if entry is not None else None
    if close is None or not fn.params:
        raise InstrumentError(f"kernel {who}: expected the parameter list on its own lines, closed by ')'")
    last = max(i for i in range(entry + 1, close) if lines[i].strip() and not lines[i].strip().startswith("//"))
    body = next((i for i in range(close, len(lines)) if lines[i].strip().startswith("{")), None)
    first = fn.instrs[0].line - 1 if fn.instrs else None
    if body is None or first is None or first <= body:
        raise InstrumentError(f"kernel {who}: expected the entry body's '{{' on a line before its first instruction")
    on_line: dict[int, list[Instr]] = {}
    for ins in fn.instrs:
        if ins.line in before:
            on_line.setdefault(ins.line, []).append(ins)
    out: list[str] = []
    for i, line in enumerate(lines):
        if i == last:
            line = line.rstrip() + ","
        elif i == close:
            out.append(f"\t.param .u64 .ptr .global .align 1 {trace}")
        elif i == first:
            out.append(f"\tld.param.u64 \t{prefix}0, [{trace}];")
            out.append(f"\tcvta.to.global.u64 \t{prefix}0, {prefix}0;")
        if i + 1 not in before:
            out.append(line)
            if i == body:
                out.append(f"\t.reg .b64 \t{prefix}<2>;")
            continue
        stripped = line.split("//", 1)[0].strip()
        if stripped.count(";") == 1 and not stripped.startswith("{"):
            out.extend(code for _, code_lines in before[i + 1] for code in code_lines)
            out.append(line)
            continue
        if stripped.startswith("{"):  # a scope opens on this line: keep it, then one statement per line
            out.append("\t{")
        codes = {id(ins): code for ins, code in before[i + 1]}
        for ins in on_line[i + 1]:
            out.extend(codes.get(id(ins), ()))
            out.append(f"\t{'@' + ins.pred + ' ' if ins.pred else ''}{ins.opcode} \t{ins.args};")
    return out


def decode_trace(instrumented: InstrumentedPTX, words: Sequence[int]) -> list[ObservedSite]:
    """Observed address ranges of the sites that executed.

    Args:
        instrumented: the instrumented kernel.
        words: the trace buffer read back as 64-bit words (signed or unsigned; ``2 * len(sites)`` at least).

    Returns:
        One :class:`ObservedSite` per site whose predicate was true for some thread: ``[min address, max address +
        width)``. Sites that never executed are left out.

    Raises:
        InstrumentError: the buffer is too short, or a slot's minimum exceeds its maximum (a corrupted trace).
    """
    if len(words) < 2 * len(instrumented.sites):
        raise InstrumentError(f"kernel {instrumented.kernel}: trace has {len(words)} words, "
                              f"{2 * len(instrumented.sites)} needed")
    out = []
    for site in instrumented.sites:
        lo, hi = words[2 * site.index] & U64_MAX, words[2 * site.index + 1] & U64_MAX
        if lo == U64_MAX and hi == 0:
            continue
        if lo > hi:
            raise InstrumentError(f"kernel {instrumented.kernel}: trace slot {site.index} (line {site.line}) has min "
                                  f"{lo:#x} > max {hi:#x}; the buffer was not initialised with initial_trace()")
        out.append(ObservedSite(site, lo, hi + site.width))
    return out


@dataclass(frozen=True)
class ViewSpan:
    """The view a launch passes for one pointer parameter.

    Attributes:
        param: runtime parameter name (``in_ptr0``...).
        buffer: program buffer (storage) name.
        base: device address of the storage's first byte.
        start / end: the view's byte span relative to the storage, half-open (the static extent of the parameter).
        nbytes: size of the storage in bytes.
    """

    param: str
    buffer: str
    base: int
    start: int
    end: int
    nbytes: int


@dataclass(frozen=True)
class ParamCheck:
    """Static summary vs observation for one parameter of one launch (extents relative to its storage, bytes).

    Attributes:
        static_reads / static_writes / static_atomic: from the PTX analysis.
        observed_reads / observed_writes / observed_atomic: some executed site inside this view loaded / stored /
            ran an atomic.
        static_extent: the view span.
        observed_extent: ``[min, max)`` over the executed sites attributed to it, or ``None`` if none touched it.
        ambiguous: some site's range lay inside this view and another parameter's view too (attributed to both).
    """

    param: str
    buffer: str
    static_reads: bool
    static_writes: bool
    static_atomic: bool
    observed_reads: bool
    observed_writes: bool
    observed_atomic: bool
    static_extent: tuple[int, int]
    observed_extent: tuple[int, int] | None
    ambiguous: bool = False

    @property
    def mode_sound(self) -> bool:
        """Every observed kind of access is in the static mode (the analysis never says read-only for a write)."""
        return ((not self.observed_reads or self.static_reads) and (not self.observed_writes or self.static_writes)
                and (not self.observed_atomic or self.static_atomic))

    @property
    def mode_exact(self) -> bool:
        return (self.observed_reads, self.observed_writes) == (self.static_reads, self.static_writes)

    @property
    def extent_sound(self) -> bool:
        o = self.observed_extent
        return o is None or (self.static_extent[0] <= o[0] and o[1] <= self.static_extent[1])

    @property
    def coverage(self) -> float:
        """Fraction of the static extent between the observed min and max (1.0: the extent is tight)."""
        o, (s, e) = self.observed_extent, self.static_extent
        return 0.0 if o is None or e <= s else (min(o[1], e) - max(o[0], s)) / (e - s)


@dataclass(frozen=True)
class StrayAccess:
    """An executed site whose address range lies in no parameter's view: the static extents missed it."""

    line: int
    opcode: str
    start: int
    end: int
    where: str


def check_launch(observed: Sequence[ObservedSite], views: Sequence[ViewSpan], static_modes: dict[str, tuple]
                 ) -> tuple[list[ParamCheck], list[StrayAccess]]:
    """Compare one launch's observed address ranges with its static summary.

    Each executed site is attributed to the parameter(s) whose view span contains its whole range; a site inside no
    view is a :class:`StrayAccess` (named by the storage it fell in, if any).

    Args:
        observed: decoded trace of the launch (:func:`decode_trace`).
        views: one entry per pointer parameter passed a tensor.
        static_modes: parameter name -> ``(reads, writes, atomic)`` from the static analysis.

    Returns:
        One :class:`ParamCheck` per view, and the stray accesses.
    """
    hits: dict[str, list[ObservedSite]] = {v.param: [] for v in views}
    shared: set[str] = set()
    stray = []
    for obs in observed:
        inside = [v for v in views if v.base + v.start <= obs.start and obs.end <= v.base + v.end]
        for v in inside:
            hits[v.param].append(obs)
        if len(inside) > 1:
            shared.update(v.param for v in inside)
        if not inside:
            owner = next((v for v in views if v.base <= obs.start < v.base + v.nbytes), None)
            where = (f"storage {owner.buffer} bytes [{obs.start - owner.base}, {obs.end - owner.base})" if owner
                     else "no storage passed to the launch")
            stray.append(StrayAccess(obs.site.line, obs.site.opcode, obs.start, obs.end, where))
    checks = []
    for v in views:
        sites = hits[v.param]
        reads, writes, atomic = static_modes.get(v.param, (True, True, True))
        extent = ((min(o.start for o in sites) - v.base, max(o.end for o in sites) - v.base) if sites else None)
        checks.append(ParamCheck(
            param=v.param, buffer=v.buffer, static_reads=reads, static_writes=writes, static_atomic=atomic,
            observed_reads=any(o.site.reads for o in sites), observed_writes=any(o.site.writes for o in sites),
            observed_atomic=any(o.site.kind == "atomic" for o in sites), static_extent=(v.start, v.end),
            observed_extent=extent, ambiguous=v.param in shared))
    return checks, stray
