"""No import circle among torch_tessera modules, imports inside functions included (walked with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "torch_tessera"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The most specific torch_tessera module that ``name`` (a module or a name inside one) refers to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports under it never run, so they form no circle."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks (their ``else`` is kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path = PACKAGE_ROOT) -> nx.DiGraph:
    """Directed graph of torch_tessera modules: an edge ``a -> b`` when ``a`` imports ``b`` anywhere in its body."""
    files = {_module_name(p): p for p in root.rglob("*.py")}
    modules = set(files)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" for a in node.names] if mod else []
            for target in targets:
                if not target.startswith("torch_tessera"):
                    continue
                dst = _resolve(target, modules)
                if dst and dst != name:
                    graph.add_edge(name, dst)
    return graph


def test_graph_sees_function_level_imports():
    graph = import_graph()
    # backend/__init__.py opens devices inside a function body: that edge must be in the graph.
    assert graph.number_of_edges() > 100
    assert any(dst.startswith("torch_tessera.target") for dst in graph.successors("torch_tessera.backend"))


def test_type_checking_imports_are_skipped_but_others_seen():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
                     "def f():\n    import c\n")
    names = {a.name for n in _runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert names == {"b", "c"}


def test_no_import_circles():
    cycles = sorted(sorted(c) for c in nx.simple_cycles(import_graph()))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles[:20])


def test_scheduler_never_imports_runtime():
    graph = import_graph()
    bad = [(a, b) for a, b in graph.edges if a.startswith("torch_tessera.scheduler")
           and b.startswith("torch_tessera.runtime")]
    assert not bad, f"scheduler imports runtime: {bad}"


def test_target_never_imports_execution():
    graph = import_graph()
    upper = ("torch_tessera.runtime", "torch_tessera.scheduler", "torch_tessera.backend", "torch_tessera.serving",
             "torch_tessera.measure", "torch_tessera.commands")
    bad = [(a, b) for a, b in graph.edges if a.startswith("torch_tessera.target") and b.startswith(upper)]
    assert not bad, f"target imports upward: {bad}"
