"""The last pass's logits rows as numpy views over llama.cpp's output buffer.

A view is made once per buffer address and row count and reused: building one per pass
(np.ctypeslib.as_array, llama-cpp-python's wrapper) runs code that a pass has just pushed out of
the caches, which made reading the row dearer than the host's argmax over it
(benchmarks/host_time.py). llama.cpp moves the buffer only when a pass needs more rows than it
holds, and then its address changes, so a view is never read after its buffer is gone.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as _binding

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Logits

_KEPT = 64  # views kept: row counts a block has, over one buffer or two


@cache
def _logits_address() -> Any:
    """llama_get_logits, answering the address as an int (a separate function object: the
    binding's own keeps its POINTER restype for llama-cpp-python's callers)."""
    func = ctypes.CDLL(_binding._lib._name).llama_get_logits
    func.argtypes, func.restype = [ctypes.c_void_p], ctypes.c_void_p
    return func


class LogitsRows:
    """rows(n): the first n rows of the context's last pass, n_vocab floats each."""

    def __init__(self, ctx: Any, n_vocab: int) -> None:
        self._ctx, self._n_vocab = ctx, n_vocab
        self._address = _logits_address()
        self._views: dict[tuple[int, int], Logits] = {}

    def rows(self, n: int) -> Logits:
        key = (self._address(self._ctx), n)
        view = self._views.get(key)
        if view is None:
            if not key[0]:  # a context that keeps no logits (llama.cpp's embeddings mode)
                raise InvalidRequestError("llama.cpp kept no logits for this pass", "load the model for generation")
            if len(self._views) >= _KEPT:
                self._views.clear()
            floats = (ctypes.c_float * (n * self._n_vocab)).from_address(key[0])
            view = self._views[key] = np.frombuffer(memoryview(floats), dtype=np.float32).reshape(n, self._n_vocab)
        return view
