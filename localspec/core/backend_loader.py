"""Finds a backend module by name and imports it only when asked, so `localspec --help`
never pays for torch or mlx and a user without them never needs them."""

from __future__ import annotations

import importlib
from typing import Any

from localspec.core import choices
from localspec.core.errors import BackendUnavailableError
from localspec.core.protocol import Backend

# llama.cpp is a package of several modules; its Backend lives in backend.py.
BACKENDS = {name: f"localspec.backends.{name}" for name in choices.BACKENDS}
BACKENDS["llamacpp"] = "localspec.backends.llamacpp.backend"


def load_backend(name: str, path: str, **options: Any) -> Backend:
    backend: Backend = backend_module(name).load(path, **options)
    return backend


def backend_module(name: str) -> Any:
    """The backend's module, imported now: the one way the core reaches a backend's code."""
    module_name = BACKENDS.get(name)
    if module_name is None:
        raise BackendUnavailableError(f"unknown backend {name!r}", f"choose one of: {', '.join(sorted(BACKENDS))}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise BackendUnavailableError(
                f"the {name} backend is not part of this localspec yet",
                "use --backend llamacpp",
            ) from exc
        raise BackendUnavailableError(
            f"the {name} backend needs the Python package {exc.name!r}",
            f"pip install 'localspec[{name}]'",
        ) from exc
    return module
