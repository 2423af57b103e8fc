"""Tiny random decoders written by the tests themselves: the same model as a GGUF (llama.cpp's
layout: Q/K rows permuted for the Llama architecture, Gemma's norms with +1 folded in) and as a
Hugging Face folder (config.json, safetensors, tokenizer.json), one per family."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.backends.vocab import byte_decoder, from_gguf
from localspec.common.gguf_header import read_header

N_CTX = 256
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# -- tiny models ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    arch: str  # "llama", "qwen2" or "gemma3"
    hidden: int = 64
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 96
    seed: int = 0
    noise: float = 0.0  # perturbs the weights: a drafter close to the seed's model
    embed_scale: float = 0.3  # larger: sharper next-token distributions
    window: int = 4  # Gemma 3's sliding window, small so that short texts cross it
    local: tuple[bool, ...] = (True, False, True)
    half: bool = False  # matrices stored as F16 in the GGUF (norms stay F32, as llama.cpp wants)
    chat_template: str = CHATML
    n_ctx: int = N_CTX  # the trained context length, which caps a loader's n_ctx
    mix: float = 1.0  # scales what each block adds to the residual: small, a model close to a bigram
    head: float = 0.0  # > 0: an output head of its own (untied), of this standard deviation per row
    vocab: int = 0  # > the tiny vocabulary: padded with control tokens to this size (llama and qwen2)


def bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    """GPT-2 style: three control tokens, the 256 byte symbols, a few merges."""
    symbols = sorted(byte_decoder(), key=lambda c: byte_decoder()[c])
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "a n", "an d", "Ġ and"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *symbols, *merged]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, types, merges


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """SentencePiece style: control tokens, byte fallback, letters and a few longer pieces."""
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the", "▁a", "nd", "▁and", "in", "▁in", "er", "on"]
    pieces += ["▁on", "ing", "▁s", "en", "▁th", "st", "ll", "▁w", "▁wor", "ld", "▁world"]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def hf_weights(spec: Spec, vocab: int) -> dict[str, np.ndarray]:
    """Random weights under Hugging Face names and conventions."""
    rng = np.random.default_rng(spec.seed)
    jitter = np.random.default_rng(spec.seed + 1000)

    def w(*shape: int, std: float) -> np.ndarray:
        x = rng.normal(0, std, shape)
        if spec.noise:
            x = x + jitter.normal(0, std * spec.noise, shape)
        return x.astype(np.float32)

    h, q, kv = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    gemma = spec.arch == "gemma3"
    norm_center = 0.0 if gemma else 1.0  # Gemma stores w and multiplies by (1 + w)
    out = {
        "model.embed_tokens.weight": w(vocab, h, std=spec.embed_scale),
        "model.norm.weight": norm_center + w(h, std=0.1),
    }
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": norm_center + w(h, std=0.1),
            p + "self_attn.q_proj.weight": w(q, h, std=h**-0.5),
            p + "self_attn.k_proj.weight": w(kv, h, std=h**-0.5),
            p + "self_attn.v_proj.weight": w(kv, h, std=h**-0.5),
            p + "self_attn.o_proj.weight": w(h, q, std=spec.mix * 0.5 * q**-0.5),
            p + "post_attention_layernorm.weight": norm_center + w(h, std=0.1),
            p + "mlp.gate_proj.weight": w(spec.ffn, h, std=h**-0.5),
            p + "mlp.up_proj.weight": w(spec.ffn, h, std=h**-0.5),
            p + "mlp.down_proj.weight": w(h, spec.ffn, std=spec.mix * 0.5 * spec.ffn**-0.5),
        }
        if spec.arch == "qwen2":
            out |= {p + f"self_attn.{x}_proj.bias": w(n, std=0.2) for x, n in (("q", q), ("k", kv), ("v", kv))}
        if gemma:
            out |= {
                p + "self_attn.q_norm.weight": w(spec.head_dim, std=0.1),
                p + "self_attn.k_norm.weight": w(spec.head_dim, std=0.1),
                p + "pre_feedforward_layernorm.weight": w(h, std=0.1),
                p + "post_feedforward_layernorm.weight": w(h, std=0.1),
            }
    if spec.head:  # drawn last: the weights above stay those of the same seed without it
        out["lm_head.weight"] = w(vocab, h, std=spec.head)
    return out


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's Q/K permutation for llama.cpp's interleaved RoPE."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(name: str, spec: Spec) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    if module == "post_attention_layernorm":
        short = "post_attention_norm" if spec.arch == "gemma3" else "ffn_norm"
    else:
        short = GGUF_NAMES[module]
    return f"blk.{layer}.{short}.{kind}"


def add_decoder_header(
    writer: Any, n_ctx: int, hidden: int, blocks: int, ffn: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    """The decoder keys every tiny model here writes alike (llama.cpp's loader requires them)."""
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(hidden)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)


def write_gguf(spec: Spec, path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), spec.arch)
    add_decoder_header(writer, spec.n_ctx, spec.hidden, spec.layers, spec.ffn, spec.heads, spec.kv_heads, spec.head_dim)
    writer.add_chat_template(spec.chat_template)
    if spec.arch == "gemma3":
        tokens, types, scores = spm_vocab()
        writer.add_rope_freq_base(1_000_000.0)
        writer.add_sliding_window(spec.window)
        writer.add_sliding_window_pattern(list(spec.local))
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_scores(scores)
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(1)
        writer.add_unk_token_id(3)
        writer.add_pad_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_add_space_prefix(False)
        vocab = len(tokens)
    else:
        writer.add_rope_freq_base(10_000.0)
        vocab = add_bpe_vocab(writer, spec.vocab, pre="qwen2" if spec.arch == "qwen2" else "smollm")
    tensors: dict[str, np.ndarray] = {}
    for name, w in hf_weights(spec, vocab).items():
        short = gguf_name(name, spec)
        if spec.arch == "llama" and short.endswith(("attn_q.weight", "attn_k.weight")):
            w = permute(w, spec.heads if "attn_q" in short else spec.kv_heads)
        if spec.arch == "gemma3" and short.endswith("norm.weight"):
            w = w + 1.0
        tensors[short] = w.astype(np.float16) if spec.half and w.ndim == 2 else w
    return write_out(writer, tensors, path)


def write_out(writer: Any, tensors: Mapping[str, np.ndarray], path: Path) -> Path:
    """Adds these tensors (int64 ones as GGUF's I64) and writes the file: header, keys, data."""
    import gguf

    for name, tensor in tensors.items():
        raw = gguf.GGMLQuantizationType.I64 if tensor.dtype == np.int64 else None
        writer.add_tensor(name, np.ascontiguousarray(tensor), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_hf_folder(spec: Spec, folder: Path, gguf_path: Path) -> Path:
    """The same model as a Hugging Face folder; its tokenizer.json is the one the backend
    built from the GGUF, saved."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    vocab = from_gguf(read_header(gguf_path).meta, str(gguf_path))
    vocab.tokenizer.save(str(folder / "tokenizer.json"))
    gemma = spec.arch == "gemma3"
    config = {
        "model_type": "gemma3_text" if gemma else spec.arch,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0 if gemma else 10_000.0,
        "max_position_embeddings": N_CTX,
        "vocab_size": len(vocab.texts),
        "tie_word_embeddings": not spec.head,
        "bos_token_id": vocab.bos,
        "eos_token_id": vocab.eos,
    }
    if gemma:
        config |= {
            "sliding_window": spec.window,
            "layer_types": ["sliding_attention" if x else "full_attention" for x in spec.local],
            "rope_local_base_freq": 10_000.0,
            "query_pre_attn_scalar": spec.head_dim,
        }
    (folder / "config.json").write_text(json.dumps(config))
    special = vocab.special_texts()
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "bos_token": special["bos_token"], "eos_token": special["eos_token"]})
    )
    save_file(hf_weights(spec, len(vocab.texts)), str(folder / "model.safetensors"))
    return folder


# -- hybrids: Qwen3.5's Gated DeltaNet layers beside attention ---------------------------------


@dataclass(frozen=True)
class HybridSpec:
    """A tiny qwen35 model: every `interval`-th block is attention, the others recurrent
    (Gated DeltaNet); `nextn` appends that many MTP blocks (the model's own drafter)."""

    layers: int = 4
    interval: int = 2
    nextn: int = 0
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 96
    ssm_state: int = 16
    ssm_groups: int = 2
    ssm_heads: int = 4  # time_step_rank: value heads
    conv_kernel: int = 4
    seed: int = 0
    noise: float = 0.0
    embed_scale: float = 0.5
    head_scale: float = 4.0  # larger: sharper next-token distributions
    tied: float = 0.2  # how much of the output head is the embedding (see qwen35_tensors)
    mtp_echo: float = 0.0  # > 0: the MTP block guesses its input token again (see qwen35_tensors)
    mtp_echo_state: bool = False  # the echo reads the hidden state instead (see qwen35_tensors)
    vocab: int = 0  # > the tiny vocabulary: padded with control tokens to this size (a real head's cost)
    half: bool = False  # matrices stored as F16 (a real size, to quantize with llama.cpp's own call)
    n_ctx: int = N_CTX  # the trained context the file declares


def qwen35_tensors(spec: HybridSpec, vocab: int) -> dict[str, np.ndarray]:
    """Random weights under llama.cpp's qwen35 tensor names, numpy shapes (GGUF ne reversed)."""
    rng = np.random.default_rng(spec.seed)
    jitter = np.random.default_rng(spec.seed + 1000)

    def w(*shape: int, std: float, center: float = 0.0) -> np.ndarray:
        x = rng.normal(0, std, shape)
        if spec.noise:
            x = x + jitter.normal(0, std * spec.noise, shape)
        return (center + x).astype(np.float32)

    h, hd = spec.hidden, spec.head_dim
    key_dim, value_dim = spec.ssm_state * spec.ssm_groups, spec.ssm_state * spec.ssm_heads
    embed = w(vocab, h, std=spec.embed_scale)
    out = {
        "token_embd.weight": embed,
        "output_norm.weight": w(h, std=0.1, center=1.0),
        # Half tied: a tied head reads the residual stream back as its own input token (a
        # random model repeats one token forever), an untied one makes noise that nothing
        # can guess; between them the text falls into loops that lookup drafts can copy.
        "output.weight": spec.tied * embed / spec.embed_scale + w(vocab, h, std=spec.head_scale * h**-0.5),
    }

    def attention(p: str) -> dict[str, np.ndarray]:
        return {
            p + "attn_q.weight": w(2 * spec.heads * hd, h, std=h**-0.5),  # the query and its gate
            p + "attn_k.weight": w(spec.kv_heads * hd, h, std=h**-0.5),
            p + "attn_v.weight": w(spec.kv_heads * hd, h, std=h**-0.5),
            p + "attn_output.weight": w(h, spec.heads * hd, std=0.5 * (spec.heads * hd) ** -0.5),
            p + "attn_q_norm.weight": w(hd, std=0.1, center=1.0),
            p + "attn_k_norm.weight": w(hd, std=0.1, center=1.0),
        }

    def common(p: str) -> dict[str, np.ndarray]:
        return {
            p + "attn_norm.weight": w(h, std=0.1, center=1.0),
            p + "post_attention_norm.weight": w(h, std=0.1, center=1.0),
            p + "ffn_gate.weight": w(spec.ffn, h, std=h**-0.5),
            p + "ffn_up.weight": w(spec.ffn, h, std=h**-0.5),
            p + "ffn_down.weight": w(h, spec.ffn, std=0.5 * spec.ffn**-0.5),
        }

    for i in range(spec.layers):
        p = f"blk.{i}."
        out |= common(p)
        if (i + 1) % spec.interval == 0:
            out |= attention(p)
            continue
        out |= {
            p + "attn_qkv.weight": w(2 * key_dim + value_dim, h, std=h**-0.5),
            p + "attn_gate.weight": w(value_dim, h, std=h**-0.5),
            p + "ssm_conv1d.weight": w(2 * key_dim + value_dim, spec.conv_kernel, std=0.5),
            p + "ssm_dt.bias": w(spec.ssm_heads, std=0.5),
            p + "ssm_a": -np.exp(w(spec.ssm_heads, std=0.5)),  # decay rates: negative
            p + "ssm_beta.weight": w(spec.ssm_heads, h, std=h**-0.5),
            p + "ssm_alpha.weight": w(spec.ssm_heads, h, std=h**-0.5),
            p + "ssm_norm.weight": w(spec.ssm_state, std=0.1, center=1.0),
            p + "ssm_out.weight": w(h, value_dim, std=0.5 * value_dim**-0.5),
        }
    for i in range(spec.layers, spec.layers + spec.nextn):
        p = f"blk.{i}."
        out |= common(p) | attention(p)
        out |= {
            p + "nextn.eh_proj.weight": w(h, 2 * h, std=(2 * h) ** -0.5),
            p + "nextn.enorm.weight": w(h, std=0.1, center=1.0),
            p + "nextn.hnorm.weight": w(h, std=0.1, center=1.0),
        }
        if spec.mtp_echo:
            # A head that guesses its input token again: right wherever the text repeats a
            # token, so tests see drafts both kept and cut.
            # With mtp_echo_state it reads the hidden state it is given instead: the target's
            # last one, whose own guess was the input token, so it guesses alike, but only
            # from the right row of the target's states.
            project = np.zeros((h, 2 * h), dtype=np.float32)
            half = slice(h, 2 * h) if spec.mtp_echo_state else slice(0, h)
            project[:, half] = spec.mtp_echo * np.eye(h, dtype=np.float32)
            out[p + "nextn.eh_proj.weight"] = project
            out[p + "attn_output.weight"] = np.zeros_like(out[p + "attn_output.weight"])
            out[p + "ffn_down.weight"] = np.zeros_like(out[p + "ffn_down.weight"])
    return out


def add_bpe_vocab(writer: Any, size: int = 0, pre: str = "qwen2") -> int:
    """The tiny byte-level BPE vocabulary (with llama.cpp's pre-tokenizer `pre`), padded with
    control tokens up to `size`; returns how many tokens it has."""
    tokens, types, merges = bpe_vocab()
    padding = max(0, size - len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens + [f"<|pad_{i}|>" for i in range(padding)])
    writer.add_token_types(types + [3] * padding)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    return len(tokens) + padding


def write_qwen35_gguf(spec: HybridSpec, path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen35")
    vocab = add_qwen35_header(writer, spec)
    tensors: dict[str, np.ndarray] = {}
    for name, tensor in qwen35_tensors(spec, vocab).items():
        half = spec.half and tensor.ndim == 2 and "ssm_conv1d" not in name  # llama.cpp never quantizes the conv
        tensors[name] = tensor.astype(np.float16) if half else tensor
    return write_out(writer, tensors, path)


def add_qwen35_header(writer: Any, spec: HybridSpec) -> int:
    """A qwen35 file's keys and tokenizer (also for benchmarks that write tensors one by one);
    returns the vocabulary size."""
    arch = "qwen35"
    blocks = spec.layers + spec.nextn
    add_decoder_header(writer, spec.n_ctx, spec.hidden, blocks, spec.ffn, spec.heads, spec.kv_heads, spec.head_dim)
    writer.add_rope_freq_base(10_000.0)
    writer.add_rope_dimension_count(spec.head_dim // 2)
    writer.add_array(f"{arch}.rope.dimension_sections", [2, 1, 1, 0])
    writer.add_uint32(f"{arch}.ssm.conv_kernel", spec.conv_kernel)
    writer.add_uint32(f"{arch}.ssm.state_size", spec.ssm_state)
    writer.add_uint32(f"{arch}.ssm.group_count", spec.ssm_groups)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", spec.ssm_heads)
    writer.add_uint32(f"{arch}.ssm.inner_size", spec.ssm_state * spec.ssm_heads)
    writer.add_uint32(f"{arch}.full_attention_interval", spec.interval)
    if spec.nextn:
        writer.add_uint32(f"{arch}.nextn_predict_layers", spec.nextn)
    writer.add_chat_template(CHATML)
    return add_bpe_vocab(writer, spec.vocab)


# -- Gemma 4 with its MTP assistant -----------------------------------------------------------


@dataclass(frozen=True)
class Gemma4Spec:
    """A tiny gemma4 target (sliding-window blocks, the last one full) and its gemma4-assistant
    drafter: a narrower model that reads the target's KV cache and last hidden state."""

    layers: int = 4
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 96
    window: int = 8
    assistant_hidden: int = 32  # must differ from the target's (llama.cpp checks)
    assistant_ffn: int = 48
    seed: int = 0
    embed_scale: float = 0.5
    head_scale: float = 4.0
    echo: bool = False  # the assistant guesses its input token again (see write_gemma4_pair)
    # An echoing assistant's attention output kept at this scale (0: none), so that what it
    # reads of the target's KV cache tilts its guesses.
    echo_attention: float = 0.0
    n_ctx: int = N_CTX  # the trained context its header gives


def _gemma4_common(writer: Any, arch: str, spec: Gemma4Spec, blocks: int, pattern: list[bool]) -> None:
    writer.add_context_length(spec.n_ctx)
    writer.add_block_count(blocks)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_uint32(f"{arch}.attention.key_length_swa", spec.head_dim)
    writer.add_uint32(f"{arch}.attention.value_length_swa", spec.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(spec.window)
    writer.add_array(f"{arch}.attention.sliding_window_pattern", pattern)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_float32(f"{arch}.rope.freq_base_swa", 10_000.0)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_uint32(f"{arch}.rope.dimension_count_swa", spec.head_dim)
    add_bpe_vocab(writer)
    writer.add_chat_template(CHATML)


def write_gemma4_pair(spec: Gemma4Spec, folder: Path) -> tuple[Path, Path]:
    """(target, assistant) GGUFs of a tiny Gemma 4 pair, random weights."""
    import gguf

    rng = np.random.default_rng(spec.seed)
    vocab = len(bpe_vocab()[0])
    hd, q, kv = spec.head_dim, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim

    def w(*shape: int, std: float, center: float = 0.0) -> np.ndarray:
        return (center + rng.normal(0, std, shape)).astype(np.float32)

    def block(p: str, h: int, ffn: int, keys: bool) -> dict[str, np.ndarray]:
        out = {
            p + "attn_norm.weight": w(h, std=0.1, center=1.0),
            p + "attn_q.weight": w(q, h, std=h**-0.5),
            p + "attn_output.weight": w(h, q, std=0.5 * q**-0.5),
            p + "attn_q_norm.weight": w(hd, std=0.1, center=1.0),
            p + "post_attention_norm.weight": w(h, std=0.1, center=1.0),
            p + "layer_output_scale.weight": np.ones(1, dtype=np.float32),
            p + "ffn_norm.weight": w(h, std=0.1, center=1.0),
            p + "ffn_gate.weight": w(ffn, h, std=h**-0.5),
            p + "ffn_up.weight": w(ffn, h, std=h**-0.5),
            p + "ffn_down.weight": w(h, ffn, std=0.5 * ffn**-0.5),
            p + "post_ffw_norm.weight": w(h, std=0.1, center=1.0),
        }
        if keys:
            out |= {
                p + "attn_k.weight": w(kv, h, std=h**-0.5),
                p + "attn_v.weight": w(kv, h, std=h**-0.5),
                p + "attn_k_norm.weight": w(hd, std=0.1, center=1.0),
            }
        return out

    embed = w(vocab, spec.hidden, std=spec.embed_scale)
    target = {
        "token_embd.weight": embed,
        "output_norm.weight": w(spec.hidden, std=0.1, center=1.0),
        "output.weight": 0.2 * embed / spec.embed_scale + w(vocab, spec.hidden, std=spec.head_scale / spec.hidden**0.5),
        "rope_freqs.weight": np.ones(hd // 2, dtype=np.float32),
    }
    for i in range(spec.layers):
        target |= block(f"blk.{i}.", spec.hidden, spec.ffn, keys=True)
    a = spec.assistant_hidden
    assistant = {
        "token_embd.weight": w(vocab, a, std=spec.embed_scale),
        "output_norm.weight": w(a, std=0.1, center=1.0),
        "rope_freqs.weight": np.ones(hd // 2, dtype=np.float32),
        "nextn.pre_projection.weight": w(a, 2 * spec.hidden, std=(2 * spec.hidden) ** -0.5),
        "nextn.post_projection.weight": w(spec.hidden, a, std=a**-0.5),
    }
    for i in range(2):
        assistant |= block(f"blk.{i}.", a, spec.assistant_ffn, keys=False)
    if spec.echo:
        # Blocks that add nothing, and a head that reads back the projection of the target's
        # embedding of the input token: right wherever the text repeats a token.
        basis = np.linalg.qr(rng.normal(size=(spec.hidden, spec.hidden)))[0][:a].astype(np.float32)
        assistant["nextn.pre_projection.weight"] = np.concatenate([basis, np.zeros_like(basis)], axis=1)
        assistant["token_embd.weight"] = embed @ basis.T
        for i in range(2):
            assistant[f"blk.{i}.post_attention_norm.weight"] *= spec.echo_attention  # the output is normed
            assistant[f"blk.{i}.ffn_down.weight"] = np.zeros_like(assistant[f"blk.{i}.ffn_down.weight"])

    paths = (folder / "gemma4.gguf", folder / "gemma4-assistant.gguf")
    for path, arch, tensors in ((paths[0], "gemma4", target), (paths[1], "gemma4-assistant", assistant)):
        writer = gguf.GGUFWriter(str(path), arch)
        if arch == "gemma4":
            _gemma4_common(writer, arch, spec, spec.layers, [True] * (spec.layers - 1) + [False])
            writer.add_embedding_length(spec.hidden)
            writer.add_feed_forward_length(spec.ffn)
            writer.add_uint32(f"{arch}.embedding_length_per_layer_input", 0)
        else:
            _gemma4_common(writer, arch, spec, 2, [True, False])
            writer.add_embedding_length(a)
            writer.add_feed_forward_length(spec.assistant_ffn)
            writer.add_uint32(f"{arch}.embedding_length_out", spec.hidden)
            writer.add_uint32(f"{arch}.nextn_predict_layers", 2)
        write_out(writer, tensors, path)
    return paths
