"""A script of a source checkout's benchmarks/ loaded as a module, for the tests that run one
small (the tiny shapes of gpu_shapes.py): by its file, not by putting benchmarks/ on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/{name}.py, imported once (as `name`: a dataclass looks its module up by name)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FOLDER / f"{name}.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no benchmark {name!r} in {FOLDER}: run the tests from a source checkout")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
