"""Tiny DSpark drafters (llama.cpp's `dflash` architecture with DSpark's Markov head), written
beside the tiny targets of gguf_writer.py with the `gguf` package, under the tensor names
llama.cpp's converter gives DeepSpec's checkpoints (markov_w1, markov_w2).

The backbone is dflash_support.py's echoing DFlash drafter. The Markov head adds to block
position i the bias markov_w2 . markov_w1[prev], prev being the anchor at position 0 and the
argmax of position i-1 after it (llama.cpp chains it inside the pass). Here that bias is the
target's own bigram: markov_w1[t] is token t's embedding through the target's final norm,
markov_w2 the target's output head, so a position guesses what the target would say after the
token before it if its layers added nothing. On a target close to a bigram (Spec(mix=...)) the
chain is right for whole blocks and wrong where the context weighs in, so steps keep blocks,
cut them, and roll back; each guess leans on the one before, which DFlash's never do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localspec.testing.dflash_support import (
    HEAD_DIM,
    DFlashShape,
    DFlashSpec,
    add_dflash_header,
    dflash_tensors,
)
from localspec.testing.gguf_writer import write_out


@dataclass(frozen=True)
class DSparkSpec:
    backbone: DFlashSpec = field(default_factory=lambda: DFlashSpec(block_size=8))
    markov: float = 1.0  # the bigram bias's scale: larger, the Markov head outvotes the backbone
    # True: anchor-first, DeepSpec's layout (the anchor's row guesses); False: SpecForge's bonus
    # anchor, whose row guesses nothing; None: no key, which llama.cpp reads as True.
    sample_from_anchor: bool | None = True
    confidence: bool = False  # a confidence head (conf_proj), which llama.cpp reads only at p_min > 0


def _tensor(reader: Any, name: str) -> np.ndarray | None:
    found = next((t for t in reader.tensors if t.name == name), None)
    if found is None:
        return None
    return np.asarray(found.data, dtype=np.float32).reshape(int(found.shape[1]), int(found.shape[0]))


def _vector(reader: Any, name: str) -> np.ndarray:
    found = next(t for t in reader.tensors if t.name == name)
    return np.asarray(found.data, dtype=np.float32).reshape(-1)


def markov_tensors(reader: Any, spec: DSparkSpec) -> dict[str, np.ndarray]:
    """The Markov head as the target's bigram (see the module doc), numpy shapes (GGUF's ne reversed)."""
    embeddings = _tensor(reader, "token_embd.weight")
    assert embeddings is not None, "the target has token embeddings"
    head = _tensor(reader, "output.weight")
    head = embeddings if head is None else head  # tied
    normed = embeddings / np.sqrt(np.mean(embeddings**2, axis=1, keepdims=True) + 1e-6)
    w1 = normed * _vector(reader, "output_norm.weight")
    out = {"markov_w1.weight": w1, "markov_w2.weight": spec.markov * head}
    if spec.confidence:
        rng = np.random.default_rng(spec.backbone.seed + 1)
        width = embeddings.shape[1]
        out["conf_proj.weight"] = rng.normal(0, (2 * width) ** -0.5, (1, width + w1.shape[1]))
        out["conf_proj.bias"] = np.full(1, 2.0)  # mostly sure: a p_min below 0.88 cuts few blocks
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def write_dspark_gguf(target: Path, path: Path, spec: DSparkSpec = DSparkSpec(), mask_id: int = 0) -> Path:
    """A DSpark drafter for the tiny target GGUF at `target`: its tokenizer, embeddings and
    (as the Markov head) bigram copied."""
    import gguf

    reader = gguf.GGUFReader(str(target))
    b = spec.backbone
    h = b.heads * HEAD_DIM
    shape = DFlashShape(1, h, b.ffn, b.heads, b.heads, HEAD_DIM, b.block_size, b.target_layers)
    embeddings = _tensor(reader, "token_embd.weight")
    assert embeddings is not None
    tensors = dflash_tensors(b, embeddings, mask_id) | markov_tensors(reader, spec)
    writer = gguf.GGUFWriter(str(path), "dflash")
    add_dflash_header(reader, writer, shape, mask_id)
    if spec.sample_from_anchor is not None:
        writer.add_bool("dflash.sample_from_anchor", spec.sample_from_anchor)  # as the converter writes it
    writer.add_bool("dflash.has_confidence_head", spec.confidence)
    return write_out(writer, tensors, path)
