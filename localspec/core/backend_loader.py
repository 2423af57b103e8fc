"""Finds a backend module by name and imports it only when asked, so `localspec --help`
never pays for torch or mlx and a user without them never needs them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from localspec.core import choices
from localspec.core.errors import BackendUnavailableError
from localspec.core.protocol import Backend


@dataclass(frozen=True)
class BackendKind:
    """What the layers above the Backend protocol know of a backend, so that none of them
    compares its name: adding a backend is its folder and one row of KINDS."""

    module: str  # where its load() lives, imported only when a model is loaded
    gguf: bool = False  # a model is one GGUF file (the first shard of a split one), else a folder
    mtp: bool = False  # runs a model's own MTP head and the Gemma 4 assistant
    dflash: bool = False  # runs DFlash block drafters (strategy dflash)
    gpu_layers: bool = False  # splits a model's layers between a GPU and the CPU (--gpu-layers)
    exact: bool = False  # can take the kernels of one-token passes for every block (--exact)
    specs: bool = False  # a "model" is a spec built in memory: never a file, never a pair
    default_model: bool = False  # loads the embedded default model when none is given
    images: bool = False  # reads images beside text through a projector file (--mmproj)
    # Keeps snapshots of a recurrent model's state with every pass, for a rejected draft's
    # rollback (load(recurrent_snapshots=N)); plain decoding asks for none.
    snapshots: bool = False


KINDS = {
    # llama.cpp is a package of several modules; its Backend lives in backend.py.
    "llamacpp": BackendKind(
        "localspec.backends.llamacpp.backend",
        gguf=True,
        mtp=True,
        dflash=True,
        gpu_layers=True,
        exact=True,
        default_model=True,
        images=True,
        snapshots=True,
    ),
    "torch": BackendKind("localspec.backends.torch"),
    "mlx": BackendKind("localspec.backends.mlx", mtp=True),
    "reference": BackendKind("localspec.backends.reference", specs=True),
}
assert set(KINDS) == set(choices.BACKENDS)
BACKENDS = {name: kind.module for name, kind in KINDS.items()}
_UNKNOWN = BackendKind("")


def kind_of(name: str) -> BackendKind:
    """The backend's row (an unknown name's has every feature off: loading it says why)."""
    return KINDS.get(name, _UNKNOWN)


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
