"""Tokenizers for the MLX backend, built so that ids match llama.cpp's for the same model.

A GGUF file carries its vocabulary (token texts, token types, BPE merges) and the name of
its pre-tokenizer; the split regexes below are llama.cpp's for those names
(src/llama-vocab.cpp), so a prompt tokenizes to the same ids on both backends and drafters
pair across them. An mlx-lm folder carries a Hugging Face tokenizer.json, used as is.
Either way the tokenizer itself is the `tokenizers` package (a dependency of mlx-lm).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from localspec.errors import ModelLoadError
from localspec.protocol import VocabIdentity

# GGUF token types (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_LLAMA3 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
# llama.cpp pre-tokenizer name -> (split regexes applied in turn, ignore_merges, default add_bos)
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    **{
        name: ((_GPT2,), False, False)
        for name in ("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "exaone4", "mellum")
    },
    **{
        name: (("\\p{N}", _GPT2), False, False)
        for name in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b")
    },
    **{
        name: ((_LLAMA3,), True, True)
        for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe")
    },
    **{name: ((_QWEN2,), False, False) for name in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez")},
    "default": (
        ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
        False,
        False,
    ),
}

# Token texts llama.cpp treats as end of generation whatever the metadata says
# (llama_vocab::impl::load, "special_eog_ids"), and the FIM tokens it adds to them.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<｜end▁of▁sentence｜>", "[e~[",
        "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
    }
)  # fmt: skip


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF = _bytes_to_unicode()


@dataclass
class Vocab:
    """A tokenizer plus what the Backend protocol asks of it, in llama.cpp's terms."""

    tokenizer: Tokenizer
    texts: list[str]  # raw token texts by id, as GGUF stores them ("Ġthe")
    types: list[int]  # GGUF token type by id
    kind: str  # "bpe" (byte-level) or "spm" (▁ for spaces, <0xNN> byte tokens)
    bos: int | None
    eos: int | None
    eog: frozenset[int]
    template: str | None = None
    _pieces: list[bytes] = field(default_factory=list, repr=False)
    _identity: VocabIdentity | None = field(default=None, repr=False)

    def encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        # encode_special_tokens=True reads control tokens as plain text, like llama.cpp's
        # parse_special=False; user-defined tokens are matched either way, as there.
        self.tokenizer.encode_special_tokens = not parse_special
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=add_special).ids
        return ids

    def token_bytes(self, token: int) -> bytes:
        if not self._pieces:
            self._pieces = [self._piece(i) for i in range(len(self.texts))]
        return self._pieces[token] if 0 <= token < len(self._pieces) else b""

    def _piece(self, token: int) -> bytes:
        """llama_token_to_piece(special=False): control tokens have no text, user-defined
        tokens are their text, normal tokens are decoded from the tokenizer's alphabet."""
        kind, text = self.types[token], self.texts[token]
        if kind in (CONTROL, UNKNOWN, UNUSED):
            return b""
        if kind == USER_DEFINED:
            return text.encode()
        if kind == BYTE:
            return bytes([int(text[3:-1], 16)]) if text.startswith("<0x") else text.encode()
        if self.kind == "spm":
            return text.replace("▁", " ").encode()
        return b"".join(bytes([_BYTE_OF[c]]) if c in _BYTE_OF else c.encode() for c in text)

    def identity(self) -> VocabIdentity:
        if self._identity is None:
            texts = tuple(t.encode() for t in self.texts)
            self._identity = VocabIdentity(self.kind, len(self.texts), self.bos, self.eos, texts)
        return self._identity

    def special_texts(self) -> dict[str, str]:
        return {
            "bos_token": self.texts[self.bos] if self.bos is not None else "",
            "eos_token": self.texts[self.eos] if self.eos is not None else "",
        }


def _meta_int(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return None if value is None else int(value)


def from_gguf_metadata(meta: Mapping[str, Any], source: str) -> Vocab:
    """The tokenizer llama.cpp would build from these GGUF keys (byte-level BPE only)."""
    model = str(meta.get("tokenizer.ggml.model", ""))
    if model != "gpt2":
        raise ModelLoadError(
            f"{source} uses a {model or 'missing'!r} tokenizer; the MLX backend reads byte-level BPE "
            "('gpt2': Llama 3, Qwen, SmolLM, ...) from GGUF files",
            "use --backend llamacpp for this file, or convert the original model with `mlx_lm.convert`",
        )
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(
            f"{source} uses the pre-tokenizer {pre!r}, which the MLX backend does not know",
            "use --backend llamacpp for this file, or convert the original model with `mlx_lm.convert`",
        )
    splits, ignore_merges, default_bos = PRE_TOKENIZERS[pre]
    texts = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [NORMAL] * len(texts))]
    merges = [tuple(str(m).split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab: dict[str, int] = {}
    for i, text in enumerate(texts):
        vocab.setdefault(text, i)
    bpe = models.BPE(vocab=vocab, merges=[(a, b) for a, b in merges], ignore_merges=ignore_merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    eog_ids = {i for i, t in enumerate(texts) if t in EOG_TEXTS}
    # llama.cpp promotes end-of-generation look-alikes to control tokens.
    types = [CONTROL if i in eog_ids else t for i, t in enumerate(types)]
    tok.add_special_tokens(
        [AddedToken(texts[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL]
    )
    tok.add_tokens(
        [AddedToken(texts[i], special=False, normalized=False) for i, t in enumerate(types) if t == USER_DEFINED]
    )
    bos = _meta_int(meta, "tokenizer.ggml.bos_token_id")
    eos = _meta_int(meta, "tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", default_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    _set_bos_eos(tok, texts, bos if add_bos else None, eos if add_eos else None)
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        special = _meta_int(meta, f"tokenizer.ggml.{key}")
        if special is not None:
            eog_ids.add(special)
    template = meta.get("tokenizer.chat_template")
    return Vocab(tok, texts, types, "bpe", bos, eos, frozenset(eog_ids), str(template) if template else None)


def _set_bos_eos(tok: Tokenizer, texts: Sequence[str], bos: int | None, eos: int | None) -> None:
    """What add_special adds: BOS in front and/or EOS behind, as the model's metadata asks."""
    if bos is None and eos is None:
        return
    pieces = [*([texts[bos]] if bos is not None else []), "$A", *([texts[eos]] if eos is not None else [])]
    specials = {texts[t]: t for t in (bos, eos) if t is not None}
    tok.post_processor = processors.TemplateProcessing(single=" ".join(pieces), special_tokens=list(specials.items()))


def from_directory(folder: Path, config: Mapping[str, Any]) -> Vocab:
    """The tokenizer of an mlx-lm (Hugging Face layout) folder: tokenizer.json plus
    tokenizer_config.json for the chat template and the special tokens."""
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(
            f"{folder} has no tokenizer.json",
            "re-save the model with `mlx_lm.convert` (it writes a fast tokenizer), or use a GGUF file",
        )
    tok = Tokenizer.from_file(str(path))
    settings = _read_json(folder / "tokenizer_config.json")
    size = tok.get_vocab_size(with_added_tokens=True)
    texts = [tok.id_to_token(i) or "" for i in range(size)]
    added = {a.content: a for a in tok.get_added_tokens_decoder().values()}
    types = []
    for text in texts:
        token = added.get(text)
        if token is None:
            types.append(BYTE if len(text) == 6 and text.startswith("<0x") and text.endswith(">") else NORMAL)
        else:
            types.append(CONTROL if token.special or text in EOG_TEXTS else USER_DEFINED)
    decoder = json.loads(tok.to_str()).get("decoder") or {}
    kind = "bpe" if "ByteLevel" in json.dumps(decoder) else "spm"
    ids = {t: i for i, t in enumerate(texts)}
    bos = ids.get(_token_text(settings.get("bos_token")))
    eos = ids.get(_token_text(settings.get("eos_token")))
    eog = {i for i, t in enumerate(texts) if t in EOG_TEXTS}
    config_eos = config.get("eos_token_id")
    for value in config_eos if isinstance(config_eos, list) else [config_eos]:
        if isinstance(value, int):
            eog.add(value)
    if eos is not None:
        eog.add(eos)
    return Vocab(tok, texts, types, kind, bos, eos, frozenset(eog), _chat_template(folder, settings))


def _token_text(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value) if value else ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _chat_template(folder: Path, settings: Mapping[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    template = settings.get("chat_template") or _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return str(template) if template else None
