"""No torch_tessera module reads another's private attributes (``obj._name``, ``from m import _name``).

Checked with ``ast`` over torch_tessera/, except compat/ (where Torch/Triton/SciPy internals belong) and runtime/
(being rewritten; its own test comes with it). Allowed: ``self._x`` / ``cls._x``; a package's private submodule
imported by a sibling module (``from torch_tessera.ptx import _triton_compat``); and the third-party private names in
:data:`THIRD_PARTY`, which belong in compat/ but are outside this check.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torch_tessera"
SKIP = ("compat", "runtime")

#: Private names of other libraries read outside compat/ today: torch (``torch._dynamo``, ``OpOverload._schema`` /
#: ``_overloadname``, ``UntypedStorage._cdata``, ``nn.Module._parameters`` / ``_buffers``, ``torch._ops``),
#: transformers (``PretrainedConfig._attn_implementation``), the standard library (``os._exit``).
THIRD_PARTY = {"_dynamo", "_schema", "_overloadname", "_cdata", "_parameters", "_buffers", "_ops",
               "_attn_implementation", "_exit"}

#: Reads of runtime/'s private names from outside it, left for the runtime rewrite (which owns those names).
RUNTIME_PENDING = {("measure/profile.py", "_stream_ctx")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reads(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """``(line, what)`` of each private read in a module's tree; ``module`` is its dotted name."""
    package = module.rsplit(".", 1)[0]
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in THIRD_PARTY:
            if not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                out.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "torch_tessera":
            for a in n.names:
                sibling_module = n.module == package and (PACKAGE.parent / package.replace(".", "/") /
                                                          f"{a.name}.py").exists()
                if _private(a.name) and not sibling_module:
                    out.append((n.lineno, f"from {n.module} import {a.name}"))
    return out


def test_no_module_reads_another_modules_private_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in SKIP:
            continue
        module = "torch_tessera." + ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for line, what in private_reads(ast.parse(path.read_text(), str(path)), module):
            if not any(str(rel) == f and what.endswith(name) for f, name in RUNTIME_PENDING):
                found.append(f"torch_tessera/{rel}:{line}: {what}")
    assert found == [], "use (or add) public API instead:\n" + "\n".join(found)


def test_the_check_sees_private_reads():
    src = ("from torch_tessera.scheduler.milp import _Model\nfrom torch_tessera.ptx import _triton_compat\n"
           "def f(pb, self):\n    pb._cache = 1\n    return self._x, pb.public, torch._dynamo, b.kind._value_\n")
    got = [w for _, w in private_reads(ast.parse(src), "torch_tessera.ptx.compile")]
    assert got == ["from torch_tessera.scheduler.milp import _Model", "pb._cache", "b.kind._value_"]
