"""Helpers over MLX modules and mlx-lm models that the backend, its MTP heads, the Gemma 4
assistant and the GGUF loader share: the compute stream, typed views of a module's tree,
sizes, quantized copies."""

from __future__ import annotations

import os
import re
import sys
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, cast

import mlx.core as mx
from mlx.nn.layers.base import Module
from mlx.nn.layers.embedding import Embedding
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear, quantize
from mlx.utils import tree_flatten

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend

if TYPE_CHECKING:
    import numpy as np

QSPEC_BITS = (2, 3, 4, 5, 6, 8)  # the widths MLX's affine quantization takes


class MlxTarget(Backend, Protocol):
    """What a head drafting inside an MLX target (an MTP head, the Gemma 4 assistant) reads
    of it: its model, its forward pass, its cache and the hidden states it last computed."""

    forward: Any
    _cache: list[Any]

    @property
    def model(self) -> Module: ...

    def hidden_states(self) -> np.ndarray: ...


@cache
def compute_stream() -> Any:
    """The stream every backend computes on: thread-local, because since MLX 0.31.2 a stream
    made in one thread cannot run work from another, and a runtime may be driven from any."""
    return mx.new_thread_local_stream(mx.default_device())


def materialize(model: Module) -> None:
    """Evaluate the model's parameters and the arrays its modules keep outside them (rope
    frequencies): nothing lazy may stay tied to the loading thread's stream."""
    eval_parameters(model)
    for _, module in modules_of(model):
        mx.eval([v for v in vars(module).values() if isinstance(v, mx.array)])


def device_name() -> str:
    device = mx.default_device()
    if device.type == mx.DeviceType.gpu:
        return "metal" if sys.platform == "darwin" else "gpu"
    return "cpu"


# Typed views of mlx.nn.Module's untyped tree accessors.


def parameters_of(module: Module) -> list[tuple[str, mx.array]]:
    """module's arrays by dotted path ("model.layers.0.mlp.up_proj.weight")."""
    flat = tree_flatten(module.parameters())  # type: ignore[no-untyped-call]
    return [(str(k), v) for k, v in cast(list[tuple[str, Any]], flat) if isinstance(v, mx.array)]


def modules_of(module: Module) -> list[tuple[str, Module]]:
    return list(module.named_modules())  # type: ignore[no-untyped-call]


def eval_parameters(module: Module) -> None:
    mx.eval([v for _, v in parameters_of(module)])


def parameter_bytes(model: Module, skip: tuple[str, ...] = ()) -> int:
    return sum(int(v.nbytes) for path, v in parameters_of(model) if not path.startswith(skip))


def parameter_count(model: Module, skip: tuple[str, ...] = ()) -> int:
    """Weights as the model has them, counting a packed quantized matrix by what it unpacks to."""
    total = 0
    for where, module in modules_of(model):
        if f"{where}.".startswith(skip):
            continue
        bits = getattr(module, "bits", None)
        for name, value in parameters_of(module):
            if "." in name:
                continue  # a child's parameter: counted with the child
            if bits and name == "weight":
                total += int(value.size) * 32 // int(bits)
            elif not bits or name not in ("scales", "biases"):
                total += int(value.size)
    return total


def gemma4_model(model: Module) -> bool:
    """A Gemma 4 model (gemma4 or gemma4_text), whose text model ends in the final norm."""
    from mlx_lm.models import gemma4_text

    text = text_model(model)
    return isinstance(text, gemma4_text.Model) and getattr(text.model, "pipeline_size", 1) == 1


def quantize_like(module: Module, weights: dict[str, mx.array]) -> None:
    """Quantize the layers of module whose weights come MLX-quantized (a .scales beside them),
    with the bits and group size their shapes give, so the weights load as they are."""

    def layout(path: str, m: Module) -> bool | dict[str, Any]:
        packed, scales = weights.get(f"{path}.weight"), weights.get(f"{path}.scales")
        if packed is None or scales is None or not hasattr(m, "to_quantized"):
            return False
        width = int(m.weight.shape[-1])
        return {"group_size": width // int(scales.shape[-1]), "bits": int(packed.shape[-1]) * 32 // width}

    if any(key.endswith(".scales") for key in weights):
        quantize(module, class_predicate=layout)


def text_model(model: Module) -> Any:
    """The part of a model that holds its text layers and args (qwen3_5 wraps one)."""
    return getattr(model, "language_model", model)


def model_name(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def typical_bits(model: Module) -> int:
    """Bits per weight that most of the model's matrix weights are stored with (16 unquantized)."""
    weights: dict[int, int] = {}
    for _, module in modules_of(model):
        if isinstance(module, QuantizedLinear | QuantizedEmbedding):
            bits = int(module.bits)
            weights[bits] = weights.get(bits, 0) + int(module.weight.size) * 32 // bits
        elif isinstance(module, Linear | Embedding):
            weights[16] = weights.get(16, 0) + int(module.weight.size)
    return max(weights, key=lambda b: weights[b]) if weights else 16


def qspec_bits(model: Module, option: str | None) -> int:
    if option is None:
        return 4 if typical_bits(model) > 4 else 2
    match = re.fullmatch(r"[Qq]?(\d)(?:_.*)?(?:bits?)?", option.strip())
    bits = int(match.group(1)) if match else 0
    if bits not in QSPEC_BITS:
        raise InvalidRequestError(
            f"qspec on MLX takes a bit width, got {option!r}", f"choose one of: {', '.join(map(str, QSPEC_BITS))}"
        )
    return bits


def low_bit_copy(model: Module, bits: int) -> Module:
    """model with every quantizable matrix requantized to bits; the rest is shared."""
    from mlx_lm.utils import dequantize_model

    group_size = 32 if bits <= 3 else 64
    model_class: Any = type(model)  # an mlx-lm Model, built from its args
    copy: Module = model_class(model.args)
    packed = {
        path: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
        for path, m in modules_of(model)
        if isinstance(m, QuantizedLinear | QuantizedEmbedding)
    }
    if packed:  # give the copy the target's layout so its weights load as they are
        quantize(copy, class_predicate=lambda path, _m: packed.get(path, False))
    copy.load_weights(parameters_of(model), strict=True)
    for mine, theirs in zip(copy.layers, model.layers, strict=True):
        if hasattr(theirs, "self_attn") and hasattr(theirs.self_attn, "rope"):
            mine.self_attn.rope = theirs.self_attn.rope  # e.g. a GGUF's frequency-factor rope
    dequantize_model(copy)
    quantize(
        copy,
        group_size=group_size,
        bits=bits,
        class_predicate=lambda _p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group_size == 0,
    )
    for _, module in modules_of(copy):  # one matrix at a time keeps the peak memory low
        if isinstance(module, QuantizedLinear | QuantizedEmbedding):
            eval_parameters(module)
    eval_parameters(copy)
    copy.eval()
    return copy
