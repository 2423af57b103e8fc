"""Every benchmark script still runs against the code it measures: each name it imports from
localspec or backends (at the top or inside a function, where the slower scripts import) is
there. A module moved in a clean-up otherwise breaks a script nobody runs until its figures
are wanted (structured_bench.py imported localspec.server.tools long after it moved)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from repo_paths import ROOT

SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
OURS = ("localspec", "backends")


def imported(path_text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) for every import of our packages in the script, wherever it stands."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(path_text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in OURS:
                found.append((node.module, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names if alias.name.split(".")[0] in OURS]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_name_a_benchmark_imports_from_the_product_exists(script: Path) -> None:
    missing = []
    for module_name, names in imported(script.read_text()):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"{module_name} ({exc})")
            continue
        for name in names:
            if not hasattr(module, name):
                try:  # a submodule imported by name: `from localspec.core import engine`
                    importlib.import_module(f"{module_name}.{name}")
                except ImportError:
                    missing.append(f"{module_name}.{name}")
    assert not missing, f"{script.name} imports what is not there: {', '.join(missing)}"


def test_the_check_finds_a_moved_module() -> None:
    text = "def f():\n    from localspec.server.tools import ToolRequest\n"
    assert imported(text) == [("localspec.server.tools", ("ToolRequest",))]
    with pytest.raises(ImportError):
        importlib.import_module("localspec.server.tools")
