"""The code's shape, checked: no module imports itself back through others, no function
in the core or a backend needs a scroll, no module but the strategy table compares a
strategy's name, and nothing changes a runtime's parts once they are assembled
(docs/architecture.md)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

from localspec.strategies import TABLE

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


def _names_a_strategy(node: ast.expr) -> bool:
    """A variable or attribute that holds a strategy's name: strategy, opts.strategy, strategies."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "strateg" in name.lower()


def _strategy_names(node: ast.expr) -> set[str]:
    """The strategy names a literal spells: "ngram", or ("draft", "dflash", *FEATURE_DRAFTERS)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value.partition(":")[0]} & set(TABLE)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_strategy_names(e) for e in node.elts if not isinstance(e, ast.Starred)))
    return set()


def strategy_name_comparisons(folders: tuple[str, ...], table: str) -> list[str]:
    """Comparisons of a strategy's name with a name spelled out (`strategy == "ngram"`,
    `opts.strategy in ("draft", "dflash")`) outside the strategy table's module, as path:line."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == table or relative.startswith("localspec/testing/"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                if any(_names_a_strategy(s) for s in sides) and any(_strategy_names(s) for s in sides):
                    found.append(f"{relative}:{node.lineno} {ast.unparse(node)}")
    return found


def test_only_the_strategy_table_compares_a_strategy_name() -> None:
    assert strategy_name_comparisons(("localspec", "backends"), "localspec/strategies.py") == []


def test_the_strategy_rule_finds_the_comparisons_it_forbids(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "m.py").write_text(
        'if opts.strategy == "ngram" or strategy in ("draft", "eagle3") or "mtp:x" != strategies:\n    pass\n'
        'if kind == "mtp" or strategy == "fastest":\n    pass\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert strategy_name_comparisons(("pkg",), "") == [
        "pkg/m.py:1 opts.strategy == 'ngram'",
        "pkg/m.py:1 strategy in ('draft', 'eagle3')",
        "pkg/m.py:1 'mtp:x' != strategies",
    ]


# The parts a runtime is assembled from (localspec.assembly), by the names code gives them.
RUNTIME_PARTS = frozenset({"runtime", "engine", "drafter", "draft", "lookup", "policy", "target"})


def _chain(node: ast.expr) -> list[str]:
    """The names an attribute's owner is reached by: runtime.engine -> [engine, runtime]."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [*names, node.id] if isinstance(node, ast.Name) else names


def _builds(name: str) -> bool:
    """Constructors and factories, which set up what they return before anyone holds it."""
    return name in ("__init__", "__post_init__") or name.startswith(("make", "build"))


def part_assignments(folders: tuple[str, ...], assembler: str) -> list[str]:
    """Assignments to an attribute of another object that is a runtime's part (`engine.trees
    = ...`, `drafter.branching = ...`, `runtime.engine.exact_prefix = ...`, `self.engine.x =
    ...`, setattr(engine, ...)) outside constructors, factories and the assembler, as path:line."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == assembler or relative.startswith("localspec/testing/"):
                continue
            for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or _builds(function.name):
                    continue
                for node in ast.walk(function):
                    for owner in _owners_assigned(node):
                        chain = _chain(owner)
                        if chain != ["self"] and RUNTIME_PARTS & set(chain):
                            found.append(f"{relative}:{node.lineno} {ast.unparse(owner)}")
    return found


def _owners_assigned(node: ast.AST) -> list[ast.expr]:
    """The objects whose attributes a statement sets (a.b = ..., a.b += ..., setattr(a, ...))."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
        return [node.args[0]]
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    else:
        return []
    flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t])]
    return [e.value for e in flat if isinstance(e, ast.Attribute)]


def test_nothing_changes_a_runtime_part_after_it_is_assembled() -> None:
    assert part_assignments(("localspec", "backends"), "localspec/assembly.py") == []


def test_the_assembly_rule_finds_the_assignments_it_forbids(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "m.py").write_text(
        "def serve(runtime, engine, job, stats):\n"
        "    runtime.engine.exact_prefix = job.exact_prefix\n"
        "    engine.trees, stats.n = None, 1\n"
        "    setattr(runtime.drafter, 'branching', 2)\n"
        "    job.outcome = 'done'\n"
        "class Runtime:\n"
        "    def __init__(self, engine):\n"
        "        engine.trees = None\n"
        "        self.policy = None\n"
        "    def swap(self):\n"
        "        self.policy = None\n"
        "        self.engine.lookup += 1\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert part_assignments(("pkg",), "") == [
        "pkg/m.py:2 runtime.engine",
        "pkg/m.py:3 engine",
        "pkg/m.py:4 runtime.drafter",
        "pkg/m.py:12 self.engine",
    ]
