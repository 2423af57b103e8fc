"""MLX backend (Apple Silicon, Metal; also mlx[cpu] on Linux, slowly, for correctness).

Models come in two layouts: an mlx-lm folder (config.json, safetensors, tokenizer.json,
quantized or not), loaded by mlx-lm itself, and a GGUF file, mapped onto mlx-lm's own
architecture modules with MLX keeping Q4_0/Q4_1/Q8_0 weights quantized. Self-drafters are
built in memory from the loaded target: `target.make_self_drafter("qspec", "2")` is a
low-bit MLX-quantized copy, `target.make_self_drafter("layerskip", "12")` runs the target's
first blocks only and shares its weights.

The acceptance test runs in the engine on numpy rows (one device sync per verify block);
moving it onto the device is the documented next step (see benchmarks/mlx_metal.md).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from localspec.core.errors import BackendUnavailableError, ModelLoadError


def unavailable_reason() -> str | None:
    """Why MLX cannot run on this machine at all, before trying to import it."""
    if sys.platform == "darwin" and platform.machine() != "arm64":
        return "MLX runs on Apple Silicon Macs; this Mac has an Intel processor (use --backend llamacpp)"
    if sys.platform not in ("darwin", "linux"):
        return f"MLX runs on macOS (Apple Silicon) and Linux, not on {sys.platform} (use --backend llamacpp)"
    return None


_reason = unavailable_reason()
if _reason:
    raise BackendUnavailableError(f"the mlx backend cannot run here: {_reason}")
try:
    import mlx.core  # noqa: F401 - fails here when the platform part of MLX is missing
    import mlx_lm.models.cache  # noqa: F401
except ImportError as exc:
    hint = "pip install 'localspec[mlx]'" + (" (installs mlx[cpu] on Linux)" if sys.platform == "linux" else "")
    raise BackendUnavailableError(f"the mlx backend needs MLX and mlx-lm ({exc})", hint) from exc

from .backend import Forward, MlxBackend  # noqa: E402
from .modules import model_name  # noqa: E402

__all__ = [
    "Forward",
    "MlxBackend",
    "load",
    "load_folder",
    "load_gguf_file",
    "unavailable_reason",
]


def load(path: str, n_ctx: int = 4096, max_block: int = 512, **_ignored: Any) -> MlxBackend:
    """An mlx-lm folder or a GGUF file; options the MLX backend has no use for (threads) are ignored."""
    if os.path.isdir(path):
        return load_folder(path, n_ctx=n_ctx, max_block=max_block)
    if not os.path.exists(path):
        raise ModelLoadError(
            f"no model at {path}",
            "give a GGUF file or an mlx-lm folder (download one with `huggingface-cli download REPO --local-dir DIR`)",
        )
    return load_gguf_file(path, n_ctx=n_ctx, max_block=max_block)


def load_gguf_file(path: str, n_ctx: int = 4096, max_block: int = 512) -> MlxBackend:
    from ..vocab import from_gguf
    from .gguf import load_gguf

    loaded = load_gguf(path)
    vocab = from_gguf(loaded.metadata, path)
    extra = {"format": "gguf", "file_type": str(loaded.metadata.get("general.file_type", 1))}
    if loaded.expanded:
        extra["dequantized"] = ",".join(f"{t}:{n}" for t, n in sorted(loaded.expanded.items()))
    return MlxBackend(
        Forward(loaded.model),
        vocab,
        name=model_name(path),
        path=os.path.abspath(path),
        architecture=str(loaded.metadata.get("general.architecture", loaded.config["model_type"])),
        n_ctx=min(n_ctx, int(loaded.config["max_position_embeddings"])),
        max_block=max_block,
        extra=extra,
    )


def load_folder(path: str, n_ctx: int = 4096, max_block: int = 512) -> MlxBackend:
    from mlx_lm.utils import load_model

    from ..vocab import from_folder

    folder = Path(path)
    if not (folder / "config.json").exists():
        raise ModelLoadError(
            f"{path} is a folder without config.json, not an mlx-lm model",
            "point to an mlx-lm model folder (from `mlx_lm.convert` or mlx-community) or to a GGUF file",
        )
    try:
        model, config = load_model(folder)
    except (FileNotFoundError, ValueError) as exc:
        raise ModelLoadError(
            f"mlx-lm could not load {path}: {exc}", "check the folder is a complete mlx-lm model"
        ) from exc
    vocab = from_folder(folder, config)
    limit = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    quant = config.get("quantization") or {}
    extra = {"format": "mlx"}
    if quant:
        extra["quantization"] = f"{quant.get('bits')}-bit/{quant.get('group_size')}"
    from .mtp import mtp_layer_count
    from .rollback import stepwise_model

    # A Qwen3.5/3.6 folder that keeps its MTP head: `auto` drafts with it, as on llama.cpp.
    layers = mtp_layer_count(str(folder)) if stepwise_model(model) else 0
    if layers:
        extra["mtp_layers"] = str(layers)
    return MlxBackend(
        Forward(model),
        vocab,
        name=model_name(path),
        path=os.path.abspath(path),
        architecture=str(config.get("model_type", "unknown")),
        n_ctx=min(n_ctx, int(limit)) if limit else n_ctx,
        max_block=max_block,
        extra=extra,
    )
