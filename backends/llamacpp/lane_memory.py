"""What one more lane of shared passes (lanes.py, `serve --parallel`) takes in memory, read from
the files' headers before anything loads, so that localspec.pool.default_parallel can choose how
many lanes fit.

A lane is a sequence of the target's context. It takes:
- the target's KV cache over n_ctx: F16 keys and values of the attention layers only. A hybrid's
  recurrent layers keep one F32 state a sequence instead, with RECURRENT_SNAPSHOTS copies beside
  it for rollback (counted whichever strategy loads them);
- its rows' logits in the target's output buffer, VERIFY_ROWS of them;
- a draft model's cache and state likewise, where one drafts (its lanes are one context too);
- the lane's stream of the cache of the model's own MTP block, of an EAGLE-3 head, or of a
  DFlash or DSpark drafter (the target's injected features), over n_ctx; a block drafter
  whose block outgrows DRAFTER_ROWS keeps a context a lane, whose buffers hold a block's
  logits over the vocabulary and its attention scores over the context.

What the lanes share is not counted: the weights, the target's and the draft model's compute
buffers, and the buffers of the one context every lane's MTP block, EAGLE-3 head, block
drafter or Gemma 4 assistant drafts in. Each term is an upper bound: llama.cpp's allocator
overlaps the compute buffer's tensors, and a sliding-window layer keeps less than n_ctx.
benchmarks/lane_memory.py sets these sizes against the ones llama.cpp reports.
"""

from __future__ import annotations

from localspec.common.gguf_header import GGUFHeader, read_header
from localspec.core.choices import FEATURE_DRAFTERS

from .build import context_cells
from .dflash import DEFAULT_BLOCK
from .head import DRAFTER_ROWS
from .recurrent import RECURRENT_SNAPSHOTS

F16, F32 = 2, 4
# A lane's rows in a verify pass at the longest drafts: the target's output buffer holds their logits.
VERIFY_ROWS = 16


def _number(header: GGUFHeader, key: str, default: int = 0) -> int:
    value = header.meta.get(f"{header.architecture}.{key}", default)
    if isinstance(value, list):  # per-layer counts (head_count_kv on some models): the largest
        value = max((v for v in value if isinstance(v, int)), default=default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _decoder_layers(header: GGUFHeader) -> int:
    """The blocks the target decodes with: an MTP block sits in a context of its own."""
    return max(_number(header, "block_count") - header.nextn_layers, 0)


def _attention_layers(header: GGUFHeader) -> int:
    """Every decoder block, or one in `full_attention_interval` on a hybrid (Qwen3.5's)."""
    interval = _number(header, "full_attention_interval", 1)
    return _decoder_layers(header) // max(interval, 1)


def kv_bytes_per_layer(header: GGUFHeader) -> int:
    """One attention layer's F16 keys and values for one token of context."""
    heads = _number(header, "attention.head_count")
    if not heads:
        return 0
    kv_heads = _number(header, "attention.head_count_kv", heads)
    key = _number(header, "attention.key_length", _number(header, "embedding_length") // heads)
    return kv_heads * (key + _number(header, "attention.value_length", key)) * F16


def kv_bytes_per_token(header: GGUFHeader) -> int:
    """The KV cache's bytes per token of context (0 where the file declares no attention)."""
    return _attention_layers(header) * kv_bytes_per_layer(header)


def recurrent_bytes(header: GGUFHeader) -> int:
    """A sequence's recurrent state on a hybrid (Gated DeltaNet: the convolution's last inputs
    and the state matrix, F32), its rollback snapshots included; 0 on a model without one."""
    inner, state = _number(header, "ssm.inner_size"), _number(header, "ssm.state_size")
    if not inner or not state:
        return 0
    conv = (_number(header, "ssm.conv_kernel", 1) - 1) * (inner + 2 * _number(header, "ssm.group_count") * state)
    layers = _decoder_layers(header) - _attention_layers(header)
    return layers * (1 + RECURRENT_SNAPSHOTS) * (conv + inner * state) * F32


def context_bytes(header: GGUFHeader, n_ctx: int) -> int:
    """A model's cache and state for one sequence of n_ctx tokens."""
    return n_ctx * kv_bytes_per_token(header) + recurrent_bytes(header)


def lane_bytes(target: str, n_ctx: int, drafter: str | None, own_head: bool) -> int:
    """One lane's memory (the module doc) for the target GGUF at `target`; drafter: the drafter
    file the strategy loads (None: none); own_head: the target's own MTP block drafts, where it
    has one and no drafter file is given."""
    header = read_header(target)
    n_ctx = context_cells(n_ctx, _number(header, "context_length"))  # as the load clamps it
    n_vocab = len(header.meta.get("tokenizer.ggml.tokens") or [])
    total = context_bytes(header, n_ctx) + VERIFY_ROWS * n_vocab * F32
    if drafter is None:
        if own_head and header.nextn_layers:  # one context for every lane's: its cache a lane
            total += n_ctx * header.nextn_layers * kv_bytes_per_layer(header)
        return total
    other = read_header(drafter)
    if other.is_assistant:  # one context for every lane's, reading the target's cache
        return total
    if other.block_kind or other.architecture in FEATURE_DRAFTERS:  # one context for every lane's
        total += n_ctx * _number(other, "block_count") * kv_bytes_per_layer(other)
        block = _number(other, "block_size", DEFAULT_BLOCK) if other.block_kind else 0
        if block > DRAFTER_ROWS:  # too long for it: a context of its own a lane, its buffers a block's
            total += block * (2 * n_vocab + n_ctx * _number(other, "attention.head_count")) * F32
        return total
    return total + context_bytes(other, n_ctx)
