"""The tokenizer, chat template and special tokens that ship inside the model files.

A GGUF carries its vocabulary as metadata; this builds the equivalent `tokenizers.Tokenizer`
so that token ids match llama.cpp's on ordinary text:

- "gpt2" (byte-level BPE: SmolLM2, Llama 3, Qwen2): the tokens and merges as they are, with the
  pre-tokenizer regex llama.cpp uses for the file's `tokenizer.ggml.pre`;
- "llama" (SentencePiece: Gemma, Llama 2, Mistral): a BPE whose merges are ranked by the score
  of the merged piece, which is the order llama.cpp's SPM tokenizer merges in, with byte
  fallback for characters outside the vocabulary.

A Hugging Face folder carries tokenizer.json, which `tokenizers` reads directly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from localspec.errors import ModelLoadError

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Texts llama.cpp treats as end of generation, whatever the metadata says.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        # fill-in-the-middle pad / repo / file separators end generation too
        "<|fim_pad|>",
        "<fim-pad>",
        "<fim_pad>",
        "<PAD>",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
        "<|file_sep|>",
    }
)

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")
# tokenizer.ggml.pre -> the regexes llama.cpp splits with before BPE (llama-vocab.cpp), in order;
# names it does not know get its "default" splits.
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo"), (_GPT2_SPLIT,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone"), (r"\p{N}", _GPT2_SPLIT)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), (_LLAMA3_SPLIT,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), (_QWEN2_SPLIT,)),
}
# Llama 3's tokenizer takes a whole pre-token that is in the vocabulary before merging.
IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"}


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, reversed: byte-level token text -> raw bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def byte_level_bytes(text: str) -> bytes:
    table = _byte_decoder()
    try:
        return bytes(table[c] for c in text)
    except KeyError:
        return text.encode("utf-8")  # an added token written in plain text


def spm_bytes(text: str) -> bytes:
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        return bytes([int(text[3:5], 16)])
    return text.replace("▁", " ").encode("utf-8")


@dataclass
class Vocabulary:
    """What the Backend protocol asks of a tokenizer, precomputed once per model."""

    tokenizer: Tokenizer
    kind: str  # "bpe" (byte-level) or "spm"
    texts: list[str]  # each token's text as the vocabulary stores it
    pieces: list[bytes]  # the bytes each token stands for when detokenizing (b"" for control tokens)
    bos: int | None
    eos: int | None
    eog: frozenset[int]
    chat_template: str | None

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        # Special-token text is matched only when asked (llama.cpp's parse_special).
        self.tokenizer.encode_special_tokens = not parse_special
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=add_special).ids
        return ids

    def special_texts(self) -> dict[str, str]:
        def text(i: int | None) -> str:
            return self.texts[i] if i is not None and 0 <= i < len(self.texts) else ""

        return {"bos_token": text(self.bos), "eos_token": text(self.eos)}


# -- from GGUF metadata -----------------------------------------------------------------------


def from_gguf(meta: Mapping[str, Any]) -> Vocabulary:
    model = str(meta.get("tokenizer.ggml.model", ""))
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens", []))
    if not tokens:
        raise ModelLoadError("the GGUF carries no tokenizer", "use a GGUF converted with its tokenizer")
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    if model == "gpt2":
        tok, kind = _gguf_bpe(meta, tokens), "bpe"
        pieces = [b"" if t in (CONTROL, UNKNOWN) else byte_level_bytes(s) for s, t in zip(tokens, types, strict=True)]
    elif model == "llama":
        tok, kind = _gguf_spm(meta, tokens, types), "spm"
        pieces = [_spm_piece(s, t) for s, t in zip(tokens, types, strict=True)]
    else:
        raise ModelLoadError(
            f"the torch backend cannot build a {model!r} tokenizer from GGUF",
            "use a Hugging Face folder with tokenizer.json, or --backend llamacpp",
        )
    _add_special_tokens(tok, tokens, types)
    bos = _opt_int(meta.get("tokenizer.ggml.bos_token_id"))
    eos = _opt_int(meta.get("tokenizer.ggml.eos_token_id"))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama"))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)]
        )
    eog = {i for i, s in enumerate(tokens) if s in EOG_TEXTS}
    for key in ("eos", "eot", "eom"):
        i = _opt_int(meta.get(f"tokenizer.ggml.{key}_token_id"))
        if i is not None:
            eog.add(i)
    template = meta.get("tokenizer.chat_template")
    return Vocabulary(tok, kind, tokens, pieces, bos, eos, frozenset(eog), template)


def _opt_int(value: Any) -> int | None:
    return None if value is None or int(value) < 0 else int(value)


def _gguf_bpe(meta: Mapping[str, Any], tokens: list[str]) -> Tokenizer:
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {s: i for i, s in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in IGNORE_MERGES))
    splits: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS.get(pre, _DEFAULT_SPLITS)
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return tok


def _gguf_spm(meta: Mapping[str, Any], tokens: list[str], types: list[int]) -> Tokenizer:
    scores: list[float] = list(meta.get("tokenizer.ggml.scores", [0.0] * len(tokens)))
    mergeable = {s: i for i, s in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
    # llama.cpp merges the adjacent pair whose concatenation scores highest; a BPE whose
    # merge ranks follow that score does the same.
    ranked = []
    for text, i in mergeable.items():
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    unk = _opt_int(meta.get("tokenizer.ggml.unknown_token_id"))
    vocab = {s: i for i, s in reversed(list(enumerate(tokens)))}  # the first id wins a duplicate text
    bpe = models.BPE(
        vocab=vocab,
        merges=[(a, b) for _, _, a, b in ranked],
        unk_token=tokens[unk] if unk is not None else None,
        byte_fallback=True,
        fuse_unk=True,
    )
    tok = Tokenizer(bpe)
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "▁")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("▁"))
    tok.normalizer = normalizers.Sequence(steps)
    return tok


def _spm_piece(text: str, kind: int) -> bytes:
    if kind in (CONTROL, UNKNOWN):
        return b""
    if kind == BYTE:
        return spm_bytes(text)
    return text.encode("utf-8") if kind == USER_DEFINED else text.replace("▁", " ").encode("utf-8")


def _add_special_tokens(tok: Tokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    # Control tokens are matched in text only with parse_special; user-defined ones always.
    control = [
        AddedToken(s, special=True, normalized=False) for s, t in zip(tokens, types, strict=True) if t == CONTROL
    ]
    user = [
        AddedToken(s, special=False, normalized=False) for s, t in zip(tokens, types, strict=True) if t == USER_DEFINED
    ]
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)


# -- from a Hugging Face folder ---------------------------------------------------------------


def from_hf(folder: Path, config: Mapping[str, Any]) -> Vocabulary:
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"no tokenizer.json in {folder}", "download the model's tokenizer files too")
    tok = Tokenizer.from_file(str(path))
    spec = json.loads(path.read_text())
    settings = _read_json(folder / "tokenizer_config.json")
    byte_level = "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    n = tok.get_vocab_size(with_added_tokens=True)
    texts = [tok.id_to_token(i) or "" for i in range(n)]
    special = {int(t["id"]) for t in spec.get("added_tokens", []) if t.get("special")}
    convert = byte_level_bytes if byte_level else spm_bytes
    pieces = [b"" if i in special else convert(s) for i, s in enumerate(texts)]
    bos = _token_id(tok, settings.get("bos_token"), config.get("bos_token_id"))
    eos = _token_id(tok, settings.get("eos_token"), config.get("eos_token_id"))
    eog = {i for i in special if texts[i] in EOG_TEXTS}
    generation = _read_json(folder / "generation_config.json")
    for source in (config.get("eos_token_id"), generation.get("eos_token_id"), eos):
        eog.update(i for i in _as_ids(source) if 0 <= i < n)
    return Vocabulary(
        tok, "bpe" if byte_level else "spm", texts, pieces, bos, eos, frozenset(eog), _hf_template(folder, settings)
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _token_id(tok: Tokenizer, setting: Any, fallback: Any) -> int | None:
    text = setting.get("content") if isinstance(setting, dict) else setting
    if isinstance(text, str) and tok.token_to_id(text) is not None:
        return tok.token_to_id(text)
    ids = _as_ids(fallback)
    return ids[0] if ids else None


def _hf_template(folder: Path, settings: Mapping[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    template = settings.get("chat_template") or _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None
