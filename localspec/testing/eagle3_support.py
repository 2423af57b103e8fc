"""Tiny EAGLE-3 heads written by the tests, in llama.cpp's eagle3 GGUF layout (what
convert_hf_to_gguf.py writes for an EAGLE-3 checkpoint with --target-model-dir), beside a tiny
llama target that is close to a bigram model (Spec(mix=...) keeps what its blocks add small,
Spec(head=...) gives it an untied output head).

A head made to agree with such a target: its one attention layer attends to its own
position (queries and keys are the same large multiple of the token's normed embedding, so
a token's own score beats the others'), its values carry that embedding to the residual
stream, and its feed-forward adds nothing, so its last state is the next token's embedding
plus g, the target's layers through fc. Read out through the target's output norm and head,
it guesses the bigram's next token: right wherever the target's context changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.testing.gguf_writer import (
    N_CTX,
    HybridSpec,
    Spec,
    add_bpe_vocab,
    add_decoder_header,
    hf_weights,
    qwen35_tensors,
    write_out,
)

ATTEND_SELF = 4.0  # the scale of queries and keys: a token's own score well above the others'


@dataclass(frozen=True)
class HeadSpec:
    layer_ids: tuple[int, ...] = (0, 1, 2)
    target_width: int = 0  # 0: the target's hidden size
    fc: float = 0.05  # the size of g against the token's embedding: larger, the context weighs more
    draft_vocab: int = 0  # > 0: an output head of its own over that many tokens, mapped by d2t
    # False: g reaches nothing (a zero hidden_norm, and norm_before_residual so the residual
    # takes the normed g): the head guesses from its input token alone, at every position of
    # a draft, so whole drafts are kept as often as the target follows its bigram.
    reads_g: bool = True
    heads: int = 4
    head_dim: int = 16
    ffn: int = 32
    seed: int = 7


def readout(target: Spec | HybridSpec, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The target's final norm and output head (its embeddings where they are tied)."""
    if isinstance(target, HybridSpec):
        weights = qwen35_tensors(target, vocab)
        return weights["output_norm.weight"], weights["output.weight"]
    weights = hf_weights(target, vocab)
    return weights["model.norm.weight"], weights.get("lm_head.weight", weights["model.embed_tokens.weight"])


def head_tensors(target: Spec | HybridSpec, head: HeadSpec, vocab: int) -> dict[str, np.ndarray]:
    """The head's tensors under llama.cpp's eagle3 names, numpy shapes (GGUF ne reversed)."""
    rng = np.random.default_rng(head.seed)
    h, width = target.hidden, head.target_width or target.hidden
    attn = head.heads * head.head_dim
    assert attn == h, "the head's attention carries the embedding over one to one"
    pick = np.zeros((attn, 2 * h), dtype=np.float32)
    pick[:, :h] = np.eye(h, dtype=np.float32)  # the token's normed embedding, not g
    norm, output = readout(target, vocab)
    out = {
        "fc.weight": rng.normal(0, head.fc * (len(head.layer_ids) * width) ** -0.5, (h, len(head.layer_ids) * width)),
        "output_norm.weight": norm,  # the target's, as its own final norm
        "blk.0.attn_norm.weight": np.ones(h),
        "blk.0.attn_norm_2.weight": np.ones(h) if head.reads_g else np.zeros(h),
        "blk.0.attn_q.weight": ATTEND_SELF * pick,
        "blk.0.attn_k.weight": ATTEND_SELF * pick,
        "blk.0.attn_v.weight": pick,
        "blk.0.attn_output.weight": np.eye(h),
        "blk.0.ffn_norm.weight": np.ones(h),
        "blk.0.ffn_gate.weight": rng.normal(0, h**-0.5, (head.ffn, h)),
        "blk.0.ffn_up.weight": rng.normal(0, h**-0.5, (head.ffn, h)),
        "blk.0.ffn_down.weight": np.zeros((h, head.ffn)),
    }
    if head.draft_vocab:  # the target's head rows of a subset of the vocabulary, and where they go
        d2t = np.sort(rng.choice(vocab, size=head.draft_vocab, replace=False)).astype(np.int64)
        out["output.weight"] = output[d2t]
        out["d2t"] = d2t
    return {k: np.ascontiguousarray(v if v.dtype == np.int64 else v.astype(np.float32)) for k, v in out.items()}


def write_eagle3_gguf(target: Spec | HybridSpec, head: HeadSpec, path: Path) -> Path:
    """An EAGLE-3 head for the tiny target `target` (see the module doc)."""
    import gguf

    arch = "eagle3"
    writer = gguf.GGUFWriter(str(path), arch)
    add_decoder_header(writer, N_CTX, target.hidden, 1, head.ffn, head.heads, head.heads, head.head_dim)
    writer.add_rope_freq_base(10_000.0)
    writer.add_array(f"{arch}.target_layers", list(head.layer_ids))
    writer.add_uint32(f"{arch}.target_hidden_size", head.target_width or target.hidden)
    if not head.reads_g:
        writer.add_bool(f"{arch}.norm_before_residual", True)
    vocab = add_bpe_vocab(writer, target.vocab, pre="smollm")  # the target's tokenizer, as the converter copies it
    return write_out(writer, head_tensors(target, head, vocab), path)
