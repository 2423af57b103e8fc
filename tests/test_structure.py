"""The code's shape, checked: no module imports itself back through others, and no function
in the core or a backend needs a scroll (docs/architecture.md)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def import_circles() -> list[list[str]]:
    """Groups of modules that import one another in a circle (Tarjan's strongly connected
    components of the module import graph, imports under TYPE_CHECKING included)."""
    graph = grimp.build_graph("localspec", "backends", exclude_type_checking_imports=False)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for module in sorted(edges):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return circles


def long_functions(folders: tuple[str, ...], most: int) -> list[str]:
    """Functions in these folders longer than `most` lines, as path:line name (length)."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > most:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length})")
    return found


def test_no_module_imports_itself_back_through_others() -> None:
    assert import_circles() == []


def test_no_function_in_the_core_or_a_backend_needs_a_scroll() -> None:
    assert long_functions(("localspec/core", "backends"), 59) == []
