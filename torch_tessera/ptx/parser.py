"""Parse the PTX that Triton emits into instructions with split operands.

The parser understands what Triton's NVPTX output for sm_80/89/90 contains: one ``.entry`` per module with ``.param``
declarations, ``.reg`` declarations, predicated instructions (``@%p1``, ``@!%p1``), vector operands (``{%r1, %r2}``),
memory operands (``[%rd1+16]``, ``[global_smem+1024]``, ``[%rd5, {%r8, %r9}]`` for tensor maps), inline-asm scopes
(``{`` ... ``}``), labels and branches, and ``.loc``/``.file``/debug sections (skipped). It checks the syntax it relies
on and raises :class:`~torch_tessera.errors.PTXParseError` naming the kernel, line number and line otherwise; it does
not judge whether an opcode exists (the analysis treats unknown opcodes conservatively).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from torch_tessera.errors import PTXParseError

_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\(?")
_PARAM = re.compile(r"^\s*\.param\s+((?:\.[\w:]+\s+(?:\d+\s+)?)*?)([\w$]+)(?:\[(\d+)\])?\s*,?\s*$")
_OPCODE = re.compile(r"[a-z][a-z0-9_]*(?:\.[A-Za-z0-9_:]+)*").fullmatch
_LOCAL_DECL = re.compile(r"\.(?:param|local)\s.*?([\w$]+)\s*(?:\[\d*\])?\s*;").match
_LABEL = re.compile(r"^([\w$]+):$")
_SYMBOL_DECL = re.compile(r"^\s*(?:\.extern\s+|\.visible\s+|\.weak\s+)?\.(shared|global|const)\s.*?([\w$]+)\s*(?:\[|;|=)")

#: Directives that stand on a line of their own without a terminating ``;``.
_BARE_DIRECTIVES = (".loc", ".file", ".section", ".pragma", ".reqntid", ".maxntid", ".minnctapersm", ".maxnreg",
                    ".explicitcluster", ".reqnctapercluster", ".maxclusterrank", ".noreturn")


class Instr(NamedTuple):
    """One PTX instruction.

    Attributes:
        line: 1-based line number in the PTX text.
        pred: guard predicate (``"%p1"`` or ``"!%p1"``), or ``None``.
        opcode: full opcode with modifiers, e.g. ``"ld.global.nc.v4.b32"``.
        args: the operand text after the opcode, without the ``;``.
    """

    line: int
    pred: str | None
    opcode: str
    args: str

    @property
    def operands(self) -> tuple[str, ...]:
        """Operands split at top-level commas (``"%rd1"``, ``"[ %rd2 + 0 ]"``, ``"{ %r1, %r2 }"``)."""
        return _split_operands(self.args) or ()


@dataclass(frozen=True)
class PTXParam:
    """One ``.param`` of the entry.

    Attributes:
        name: PTX name (``<kernel>_param_<i>``).
        index: position in the entry's parameter list.
        width: width in bits (``.u64`` -> 64; byte arrays: 8 x length).
        is_pointer: declared ``.ptr`` (Triton marks every pointer argument and its scratch pointers so).
        is_tensormap: a byte array of 128 bytes (a TMA descriptor passed by value, ``__grid_constant__``).
    """

    name: str
    index: int
    width: int
    is_pointer: bool
    is_tensormap: bool = False


@dataclass(frozen=True)
class PTXFunction:
    """The parsed ``.entry`` of a PTX module.

    Attributes:
        name: entry name.
        params: entry parameters in order.
        instrs: instructions in text order (labels excluded).
        labels: label name -> index into ``instrs`` of the next instruction.
        shared_symbols: ``.shared`` symbols of the module (``global_smem``).
        global_symbols: ``.global``/``.const`` symbols of the module (assert strings...).
        local_symbols: ``.local`` symbols of the body (stack frames, ``__local_depot0``).
        loop_heads: index into ``instrs`` of every target of a backward branch (a loop head), sorted.
    """

    name: str
    params: tuple[PTXParam, ...]
    instrs: tuple[Instr, ...]
    labels: dict
    shared_symbols: frozenset[str]
    global_symbols: frozenset[str]
    local_symbols: frozenset[str]
    loop_heads: tuple[int, ...]


def _fail(kernel: str, lineno: int, line: str, why: str) -> PTXParseError:
    return PTXParseError(f"malformed PTX in kernel {kernel!r}, line {lineno}: {why}\n    {line.strip()}")


def _split_operands(text: str) -> tuple[str, ...] | None:
    """Split at commas outside ``[]``, ``{}`` and ``()``; ``None`` if the brackets do not balance."""
    if "{" not in text and "(" not in text:
        if text.count("[") != text.count("]"):
            return None
        return tuple(p.strip() for p in text.split(",")) if text else ()
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth != 0:
        return None
    parts.append(text[start:].strip())
    return tuple(parts)


def _param(lineno: int, line: str, index: int, kernel: str) -> PTXParam:
    m = _PARAM.match(line)
    if not m:
        raise _fail(kernel, lineno, line, "expected a '.param <type> <name>' declaration")
    mods, name, count = m.group(1).split(), m.group(2), m.group(3)
    width = 64
    for mod in mods:
        if mod[1:2] in "bsuf" and mod[2:].isdigit():
            width = int(mod[2:])
    if count is not None:
        width *= int(count)
    return PTXParam(name=name, index=index, width=width, is_pointer=".ptr" in mods,
                    is_tensormap=count is not None and width == 1024)


def parse_entry_params(text: str, kernel: str | None = None) -> tuple[PTXParam, ...]:
    """Only the ``.param`` list of the entry (cheap: stops at the body)."""
    lines = text.split("\n")
    _, _, params, _, _ = _parse_header(lines, kernel)
    return tuple(params)


def _parse_header(lines: list[str], kernel: str | None):
    """Module symbols and the entry's parameter list; returns (name, who, params, next line index, symbols)."""
    who = kernel or "<unknown>"
    shared, globals_ = set(), set()
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        m = _ENTRY.match(line)
        if m:
            break
        s = line.lstrip()
        if s.startswith((".extern", ".shared", ".global", ".const", ".visible .global")):
            d = _SYMBOL_DECL.match(line)
            if d:
                (shared if d.group(1) == "shared" else globals_).add(d.group(2))
        i += 1
    else:
        raise PTXParseError(f"malformed PTX in kernel {who!r}: no '.entry' found ({n} lines)")
    name = m.group(1)
    who = kernel or name
    params: list[PTXParam] = []
    if line[m.end():].strip().startswith(")"):
        i += 1
    else:
        i += 1
        while True:
            if i >= n:
                raise _fail(who, i, lines[-1], "parameter list of the entry is not closed with ')'")
            s = lines[i].strip()
            if s.startswith(")"):
                i += 1
                break
            if s and not s.startswith("//"):
                params.append(_param(i + 1, lines[i], len(params), who))
            i += 1
    return name, who, params, i, (shared, globals_)


def parse_ptx(text: str, kernel: str | None = None) -> PTXFunction:
    """Parse a PTX module holding one ``.entry``.

    Args:
        text: the PTX text.
        kernel: the name used in error messages (defaults to the entry's name).

    Returns:
        The entry function.

    Raises:
        PTXParseError: the text has no entry, an unterminated parameter list or body, a statement without ``;``,
            unbalanced brackets, a bad opcode, an ``ld.param`` of an undeclared parameter, or a branch to an undefined
            label. The message names the kernel, the 1-based line number and the line.
    """
    lines = text.split("\n")
    n = len(lines)
    name, who, params, i, (shared, globals_) = _parse_header(lines, kernel)
    param_names = {p.name for p in params}
    locals_: set[str] = set()
    # Body: up to the '{' that opens it, then statements until the matching '}'.
    while i < n and not lines[i].strip().startswith("{"):
        s = lines[i].strip()
        if s and not s.startswith(("//", ".")):
            raise _fail(who, i + 1, lines[i], "expected '{' opening the entry body")
        i += 1
    if i >= n:
        raise PTXParseError(f"malformed PTX in kernel {who!r}: entry {name} has no body")
    depth = 1
    i += 1
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    branches: list[tuple[int, str, int, str]] = []
    append = instrs.append
    good_opcodes: set[str] = set()
    while i < n:
        raw = lines[i]
        i += 1
        s = raw.strip()
        if not s:
            continue
        c = s[0]
        if c == "/":
            continue
        if "//" in s:
            s = s.split("//", 1)[0].rstrip()
            if not s:
                continue
        if c == "{":
            depth += 1
            s = s[1:].strip()
            if not s:
                continue
            c = s[0]
        if c == "}":
            depth -= 1
            if depth == 0:
                break
            continue
        if c == ".":
            if s.endswith(";"):
                if s.startswith((".param", ".local")):  # call-sequence params, stack frames
                    d = _LOCAL_DECL(s)
                    if d:
                        (param_names if s[1] == "p" else locals_).add(d.group(1))
                continue
            if s.startswith(_BARE_DIRECTIVES):
                continue
            raise _fail(who, i, raw, "directive without ';'")
        if s[-1] == ":":
            lm = _LABEL.match(s)
            if not lm:
                raise _fail(who, i, raw, "bad label")
            labels[lm.group(1)] = len(instrs)
            continue
        if s[-1] != ";":
            raise _fail(who, i, raw, "statement does not end with ';'")
        for stmt in (s[:-1],) if s.count(";") == 1 else [t.strip() for t in s.split(";") if t.strip()]:
            pred = None
            if stmt[0] == "@":
                parts = stmt.split(None, 2)
                if len(parts) < 2:
                    raise _fail(who, i, raw, "predicate without an instruction")
                pred = parts[0][1:]
            else:
                parts = stmt.split(None, 1)
            opcode = parts[1 if pred else 0]
            args = parts[-1].rstrip() if len(parts) == (3 if pred else 2) else ""
            if opcode not in good_opcodes:
                if not _OPCODE(opcode):
                    raise _fail(who, i, raw, f"bad opcode {opcode!r}")
                good_opcodes.add(opcode)
            if args.count("[") != args.count("]") or args.count("{") != args.count("}"):
                raise _fail(who, i, raw, "unbalanced brackets in the operands")
            if opcode[0] == "b" and opcode.startswith("bra"):
                branches.append((i, args.rsplit(",", 1)[-1].strip(), len(instrs), raw))
            elif opcode[0] == "l" and opcode.startswith("ld.param"):
                sym = args[args.find("[") + 1:].split("]")[0].split("+")[0].strip()
                if sym not in param_names:
                    raise _fail(who, i, raw, f"ld.param of undeclared parameter {sym!r}")
            append(Instr(i, pred, opcode, args))
    else:
        raise PTXParseError(f"malformed PTX in kernel {who!r}: body of entry {name} is not closed with '}}'")
    heads = set()
    for lineno, target, at, raw in branches:
        if target not in labels:
            raise _fail(who, lineno, raw, f"branch to undefined label {target!r}")
        if labels[target] <= at:
            heads.add(labels[target])
    return PTXFunction(name=name, params=tuple(params), instrs=tuple(instrs), labels=labels,
                       shared_symbols=frozenset(shared), global_symbols=frozenset(globals_),
                       local_symbols=frozenset(locals_), loop_heads=tuple(sorted(heads)))
