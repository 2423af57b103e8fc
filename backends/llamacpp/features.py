"""The target's hidden states that drafters read, kept on the host one row per cached position.

An MTP head reads the target's last hidden state; an EAGLE-3 head and a DFlash drafter read
the inputs of a few of its layers (their GGUF's target_layer_ids), concatenated. An EAGLE-3
head may name layer n_layers, one past the last: the target's final hidden state, which
llama.cpp's draft-eagle3 reads as the MTP heads' state (llama_get_embeddings_nextn). llama.cpp
hands both out per decode only, for every token of the batch whatever its output flag
(llama_context::extract_layer_inputs copies the whole layer input), so they are copied here
as the target decodes. A row is written when its position is decoded and written again when
it is decoded again: after a rollback to n, rows below n are still the ones a clean pass
gives, and rows from n on are overwritten before anything reads them. A tree pass (tree.py)
writes its nodes' rows in node order and the kept root path's are then moved to the
positions it holds (keep_path): each node's row is its root path's, as its logits are.

The layer-input calls come from llama.cpp's staging header (src/llama-ext.h) and are exported
as C++ symbols; they are bound here through the libllama that llama-cpp-python loaded, as
llama_cpp.llama_cpp_ext binds the nextn ones. Turning capture on for a layer the target's
graph does not expose aborts the process inside llama.cpp, so check_capture refuses first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as _binding
from llama_cpp import llama_cpp_ext as ext

from localspec.core.errors import ModelLoadError

# The architectures whose llama.cpp graph exposes each layer's input (res->t_layer_inp in
# src/models/*.cpp); for any other, llama.cpp aborts when the first pass is built.
CAPTURING_ARCHITECTURES = frozenset(
    {
        "bailingmoe3",
        "deepseek4",
        "gemma4",
        "gpt-oss",
        "hunyuan-vl",
        "lfm2",
        "llama",
        "mimo2",
        "minimax-01",
        "minimax-m2",
        "muse-glimmer",
        "nanbeige",
        "nemotron_h",
        "qwen3",
        "qwen35",
        "qwen35moe",
        "qwen3moe",
        "qwen3next",
        "qwen4exp",
    }
)

# The architectures whose llama.cpp graph hands out its final hidden state (res->t_h_nextn in
# the main graph of src/models/*.cpp). Elsewhere llama.cpp's draft-eagle3 reads a buffer that
# nothing fills for layer n_layers; localspec reads zeros there, the same head's arithmetic.
FINAL_STATE_ARCHITECTURES = frozenset(
    {"bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "mimo2", "nemotron_h", "qwen35", "qwen35moe", "qwen3next"}
)

# The drafter that may read the final hidden state (as layer n_layers): llama.cpp's
# draft-dflash asks for that layer's input instead, which few graphs give.
EAGLE3_KIND = "EAGLE-3 head"

_FLOATS = ctypes.POINTER(ctypes.c_float)


@dataclass(frozen=True)
class LayerCalls:
    """The staging API's calls, bound to the loaded libllama."""

    set_layer_inp: Any  # (ctx, layer, on) -> None
    get_layer_inp: Any  # (ctx, layer) -> float*: n_batch rows of n_embd, the last batch's
    target_layer_ids: Any  # (model) -> const int32_t*
    target_layer_ids_n: Any  # (model) -> uint32_t


def _bind(lib: Any, symbol: str, argtypes: list[Any], restype: Any) -> Any:
    func = getattr(lib, symbol)
    func.argtypes, func.restype = argtypes, restype
    return func


@cache
def layer_calls() -> LayerCalls:
    """The calls, or a ModelLoadError naming the llama-cpp-python that has them."""
    lib, ctx_p, model_p = _binding._lib, _binding.llama_context_p_ctypes, _binding.llama_model_p_ctypes
    try:
        return LayerCalls(
            _bind(
                lib,
                "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
                [ctx_p, ctypes.c_uint32, ctypes.c_bool],
                None,
            ),
            _bind(lib, "_Z30llama_get_embeddings_layer_inpP13llama_contextj", [ctx_p, ctypes.c_uint32], _FLOATS),
            _bind(lib, "_Z28llama_model_target_layer_idsPK11llama_model", [model_p], ctypes.POINTER(ctypes.c_int32)),
            _bind(lib, "_Z30llama_model_target_layer_ids_nPK11llama_model", [model_p], ctypes.c_uint32),
        )
    except AttributeError as exc:
        raise ModelLoadError(
            "this llama-cpp-python's llama.cpp cannot hand out a target's hidden layers",
            "install llama-cpp-python 0.3.36 or newer, or draft with --strategy ngram",
        ) from exc


def target_layer_ids(model: Any) -> tuple[int, ...]:
    """The layers of its target a drafter model reads (its GGUF's <arch>.target_layers)."""
    calls = layer_calls()
    n = int(calls.target_layer_ids_n(model))
    ids = calls.target_layer_ids(model)
    return tuple(int(ids[k]) for k in range(n)) if n and ids else ()


@dataclass(frozen=True)
class TargetShape:
    """What of a target decides whether a drafter's features can come from it."""

    name: str
    architecture: str
    n_layers: int
    n_embd: int


def check_capture(target: TargetShape, drafter: str, kind: str, ids: Sequence[int], width: int) -> None:
    """Refuse a drafter whose layers or width its target cannot give, before llama.cpp aborts
    on them. kind names the drafter ("EAGLE-3 head"); width: the hidden size it was made for."""
    fits = f"use the {kind} made for {target.name} (its pair in models.toml), or --strategy ngram"
    if not ids:
        raise ModelLoadError(
            f"{drafter} names no layers of its target to read (its GGUF has no target_layers): not an {kind}",
            f"convert it with llama.cpp's convert_hf_to_gguf.py --target-model-dir <target>, or {fits}",
        )
    if target.architecture not in CAPTURING_ARCHITECTURES:
        raise ModelLoadError(
            f"llama.cpp cannot hand out the hidden layers of {target.name} ({target.architecture}), "
            f"which the {kind} {drafter} reads",
            "use --strategy ngram, or a draft model (--draft-model)",
        )
    last = target.n_layers if kind == EAGLE3_KIND else target.n_layers - 1  # n_layers: the final state
    beyond = [i for i in ids if not 0 <= i <= last]
    if beyond:
        final = f" and its final hidden state (layer {last})" if last == target.n_layers else ""
        raise ModelLoadError(
            f"{drafter} reads layer {beyond[0]} of its target, but {target.name} has layers 0-{target.n_layers - 1}"
            f"{final}: it was made for a deeper model",
            fits,
        )
    if width != target.n_embd:
        raise ModelLoadError(
            f"{drafter} reads hidden states {width} wide, but {target.name}'s are {target.n_embd}: "
            "it was made for another model",
            fits,
        )


class HiddenRows:
    """The target's hidden states, one row per cached position (see the module doc): `parts`
    read the last decode's rows, each `part_width` wide, side by side in a row."""

    def __init__(self, n_ctx: int, parts: Sequence[Callable[[], Any]], part_width: int) -> None:
        self._parts, self.part_width = list(parts), part_width
        self.width = part_width * len(self._parts)
        # Zeros from calloc: memory is committed only for the positions decoded.
        self.rows = np.zeros((n_ctx, self.width), dtype=np.float32)

    def record(self, past: int, n: int, first: int = 0) -> None:
        """Copy the rows of the n tokens just decoded at positions past.., from the decode's
        row `first` on (a lane's block in a shared pass, lanes.py: llama.cpp hands them out in
        the batch's order)."""
        w = self.part_width
        for k, part in enumerate(self._parts):
            ptr = part()
            if ptr:
                decoded = np.ctypeslib.as_array(ptr, shape=(first + n, w))
                self.rows[past : past + n, k * w : (k + 1) * w] = decoded[first:]

    def keep_path(self, past: int, path: Sequence[int]) -> None:
        """After a tree pass recorded its nodes' rows at past + node: the rows of a kept root
        path (node indices, path[0] == 0) at the positions past.. that it now holds."""
        if list(path) != list(range(len(path))):
            self.rows[past : past + len(path)] = self.rows[past + np.asarray(path, dtype=np.intp)]


def last_hidden_states(ctx: Any, n_ctx: int, width: int) -> HiddenRows:
    """The rows an MTP head reads: the target's last hidden state at every position."""
    ext.llama_set_embeddings_nextn(ctx, True, False)  # a row for every token of a batch
    return HiddenRows(n_ctx, [partial(ext.llama_get_embeddings_nextn, ctx)], width)


def layer_inputs(ctx: Any, n_ctx: int, ids: Sequence[int], n_embd: int) -> HiddenRows:
    """The rows an EAGLE-3 or DFlash drafter reads: the inputs of layers `ids`, concatenated
    in that order (n_embd * len(ids) wide), layer n_layers being the final hidden state.
    Check the ids with check_capture first."""
    calls = layer_calls()
    model = _binding.llama_get_model(ctx)
    n_layers = int(_binding.llama_model_n_layer(model))
    parts: list[Callable[[], Any]] = []
    for layer in ids:
        if layer < n_layers:
            calls.set_layer_inp(ctx, layer, True)
            parts.append(partial(calls.get_layer_inp, ctx, layer))
        elif _architecture(model) in FINAL_STATE_ARCHITECTURES:
            ext.llama_set_embeddings_nextn(ctx, True, False)  # a row for every token, as last_hidden_states
            parts.append(partial(ext.llama_get_embeddings_nextn, ctx))
        else:
            parts.append(_nothing)  # rows stay zero (see FINAL_STATE_ARCHITECTURES)
    return HiddenRows(n_ctx, parts, n_embd)


def _nothing() -> None:
    return None


def _architecture(model: Any) -> str:
    buf = ctypes.create_string_buffer(64)
    _binding.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
    return buf.value.decode()
