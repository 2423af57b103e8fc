"""The code's shape, checked: no module imports itself back through others, no product
module passes 500 lines, no function in the product needs a scroll or more than six
parameters, no module but the strategy table compares a strategy's name, and nothing changes
a runtime's parts once they are assembled (docs/architecture.md)."""

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


# What the tests and the benchmarks share (fixture writers, a fake hub): not the product, and
# nothing in the product imports it (the layers contract), so its shape is not the product's.
TEST_SUPPORT = "localspec/testing/"


def _functions(folders: tuple[str, ...]) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function in these folders' product modules, with its path:line."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(TEST_SUPPORT):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    found.append((f"{relative}:{node.lineno}", node))
    return found


def long_functions(folders: tuple[str, ...], most: int) -> list[str]:
    """Functions in these folders longer than `most` lines, as path:line name (length)."""
    found = []
    for where, node in _functions(folders):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > most:
            found.append(f"{where} {node.name} ({length})")
    return found


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A function's parameters, self and cls aside, *args and **kwargs included."""
    args = node.args
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg not in ("self", "cls")]
    return named + [a.arg for a in (args.vararg, args.kwarg) if a is not None]


def many_parameters(folders: tuple[str, ...], most: int) -> dict[str, int]:
    """Functions in these folders taking more than `most` parameters: path:name -> how many."""
    found = {}
    for where, node in _functions(folders):
        if len(parameters(node)) > most:
            found[f"{where.partition(':')[0]}:{node.name}"] = len(parameters(node))
    return found


# Functions that still take more than six parameters, each with why it has not yet moved to a
# typed value. Shrink this; never grow it.
KERNEL = "a native kernel's arguments, as its C function (backends/torch/native.py) takes them, per layer"
NOT_YET = "not yet converted to a typed value (issue 54 item 4)"
MANY_PARAMETERS_ALLOWED = {
    "localspec/core/engine.py:generate": NOT_YET,
    "localspec/core/engine.py:_record": NOT_YET,
    "localspec/server/request_prompts.py:stream_kwargs": NOT_YET,
    "localspec/control/replay.py:replay": NOT_YET,
    "localspec/control/tree_replay.py:replay_tree": NOT_YET,
    "localspec/control/tree_replay.py:replay_head_tree": NOT_YET,
    "backends/llamacpp/backend.py:__init__": NOT_YET,
    "backends/torch/layers.py:rope_attend": KERNEL,
    "backends/torch/layers.py:__init__": NOT_YET,
    "backends/torch/native.py:rope_attention": KERNEL,
}


def test_no_module_imports_itself_back_through_others() -> None:
    assert import_circles() == []


def test_no_function_in_the_product_needs_a_scroll() -> None:
    assert long_functions(("localspec", "backends"), 59) == []


def test_a_function_with_more_than_six_parameters_takes_a_typed_value_instead() -> None:
    found = many_parameters(("localspec", "backends"), 6)
    assert sorted(set(found) - set(MANY_PARAMETERS_ALLOWED)) == []
    # An entry whose function now takes six or fewer goes from the list.
    assert sorted(set(MANY_PARAMETERS_ALLOWED) - set(found)) == []


def long_modules(folders: tuple[str, ...], most: int) -> list[str]:
    """Product modules (test support aside) longer than `most` lines, as path (lines)."""
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if not relative.startswith(TEST_SUPPORT) and lines > most:
                found.append(f"{relative} ({lines})")
    return found


def test_no_product_module_holds_more_than_one_screenful_of_jobs() -> None:
    # 500 lines: past that a module has held two concepts every time so far (issue 54).
    assert long_modules(("localspec", "backends"), 500) == []


def test_the_shape_rules_find_what_they_forbid(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    (folder / "m.py").write_text(
        f"def short(a, b, c, d, e, f):\n{body}\n"
        f"def scroll(self):\n{body}    x = 1\n    return x\n\n"
        "def wide(self, a, b, c, d, e, *rest, **more):\n    pass\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert long_functions(("pkg",), 59) == ["pkg/m.py:61 scroll (61)"]
    assert many_parameters(("pkg",), 6) == {"pkg/m.py:wide": 7}
    (folder / "big.py").write_text("x = 1\n" * 501)
    assert long_modules(("pkg",), 500) == ["pkg/big.py (501)"]


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
