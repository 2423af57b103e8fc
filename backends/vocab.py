"""The tokenizer, chat template and special tokens that ship inside the model files, built so
that token ids match llama.cpp's for the same model; shared by the torch and MLX backends.

A GGUF carries its vocabulary as metadata; this builds the equivalent `tokenizers.Tokenizer`:

- "gpt2" (byte-level BPE: SmolLM2, Llama 3, Qwen2): the tokens and merges as they are, split
  first by the regexes llama.cpp uses for the file's `tokenizer.ggml.pre` (src/llama-vocab.cpp);
  a name missing from the table below is refused, as llama.cpp refuses names it does not know,
  rather than splitting differently and drafting with ids llama.cpp would not produce;
- "llama" (SentencePiece: Gemma, Llama 2, Mistral): a BPE whose merges are ranked by the score
  of the merged piece, which is the order llama.cpp's SPM tokenizer merges in, with byte
  fallback for characters outside the vocabulary.

A Hugging Face (or mlx-lm) folder carries tokenizer.json, which `tokenizers` reads directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from localspec.core.errors import ModelLoadError
from localspec.core.protocol import VocabIdentity

# GGUF token types (llama.cpp's llama_token_type)
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
# llama.cpp pre-tokenizer name -> (split regexes applied in turn, ignore_merges, default add_bos);
# a file without the key gets "default", as in llama.cpp.
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    **dict.fromkeys(
        ("gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais", "trillion", "exaone4", "mellum"),
        ((_GPT2,), False, False),
    ),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
        (("\\p{N}", _GPT2), False, False),
    ),
    # Llama 3's tokenizer takes a whole pre-token that is in the vocabulary before merging.
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"), ((_LLAMA3,), True, True)),
    **dict.fromkeys(("dbrx", "smaug-bpe"), ((_LLAMA3,), False, False)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"), ((_QWEN2,), False, False)),
    "falcon": (("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"), False, False),
    "deepseek-coder": (("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"), False, False),
    "default": (("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"), False, False),
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


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, reversed: byte-level token character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def piece(text: str, kind: int, spm: bool) -> bytes:
    """llama_token_to_piece(special=False): control tokens have no text, user-defined tokens
    are their text, normal tokens are decoded from the tokenizer's alphabet."""
    if kind == USER_DEFINED:
        return text.encode()
    if kind == BYTE and spm:
        return bytes([int(text[3:-1], 16)]) if text.startswith("<0x") else text.encode()
    if kind != NORMAL:
        return b""
    if spm:
        return text.replace("▁", " ").encode()
    table = byte_decoder()
    return b"".join(bytes([table[c]]) if c in table else c.encode() for c in text)


@dataclass
class Vocab:
    """A tokenizer plus what the Backend protocol asks of it, in llama.cpp's terms
    (core.protocol.Vocabulary: the torch and MLX backends answer their text methods with it)."""

    tokenizer: Tokenizer
    kind: str  # "bpe" (byte-level) or "spm" (▁ for spaces, <0xNN> byte tokens)
    texts: list[str]  # each token's text as the vocabulary stores it ("Ġthe")
    pieces: list[bytes]  # the bytes each token stands for when detokenizing (b"" for control tokens)
    bos: int | None
    eos: int | None
    eog: frozenset[int]
    template: str | None  # the chat template
    _identity: VocabIdentity | None = field(default=None, repr=False)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        # encode_special_tokens=True reads control tokens as plain text, like llama.cpp's
        # parse_special=False; user-defined tokens are matched either way, as there.
        self.tokenizer.encode_special_tokens = not parse_special
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=add_special).ids
        return ids

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token] if 0 <= token < len(self.pieces) else b""

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def vocab_identity(self) -> VocabIdentity:
        if self._identity is None:
            texts = tuple(t.encode() for t in self.texts)
            self._identity = VocabIdentity(self.kind, len(texts), self.bos, self.eos, texts)
        return self._identity

    def end_of_generation(self) -> frozenset[int]:
        return self.eog

    def chat_template(self) -> str | None:
        return self.template

    def special_texts(self) -> dict[str, str]:
        def text(i: int | None) -> str:
            return self.texts[i] if i is not None and 0 <= i < len(self.texts) else ""

        return {"bos_token": text(self.bos), "eos_token": text(self.eos)}


# -- from GGUF metadata -----------------------------------------------------------------------


def from_gguf(meta: Mapping[str, Any], source: str) -> Vocab:
    """The tokenizer llama.cpp would build from these GGUF keys; source names the file."""
    model = str(meta.get("tokenizer.ggml.model", ""))
    texts = [str(t) for t in meta.get("tokenizer.ggml.tokens", [])]
    if not texts:
        raise ModelLoadError(f"{source} carries no tokenizer", "use a GGUF converted with its tokenizer")
    stored = [int(t) for t in meta.get("tokenizer.ggml.token_type", [NORMAL] * len(texts))]
    if model == "gpt2":
        tok, default_bos = _gguf_bpe(meta, texts, source)
    elif model == "llama":
        tok, default_bos = _gguf_spm(meta, texts, stored), True
    else:
        raise ModelLoadError(
            f"{source} uses a {model or 'missing'!r} tokenizer; localspec builds byte-level BPE ('gpt2': Llama 3, "
            "Qwen, SmolLM, ...) and SentencePiece ('llama': Gemma, Llama 2, Mistral) tokenizers from GGUF",
            "use --backend llamacpp for this file",
        )
    eog = {i for i, t in enumerate(texts) if t in EOG_TEXTS}
    # llama.cpp promotes end-of-generation look-alikes to control tokens.
    types = [CONTROL if i in eog else t for i, t in enumerate(stored)]
    _add_special_tokens(tok, texts, types)
    bos = _token_id(meta.get("tokenizer.ggml.bos_token_id"))
    eos = _token_id(meta.get("tokenizer.ggml.eos_token_id"))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", default_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    _set_bos_eos(tok, texts, bos if add_bos else None, eos if add_eos else None)
    for key in ("eos", "eot", "eom"):
        special = _token_id(meta.get(f"tokenizer.ggml.{key}_token_id"))
        if special is not None:
            eog.add(special)
    spm = model == "llama"
    pieces = [piece(s, t, spm) for s, t in zip(texts, types, strict=True)]
    template = meta.get("tokenizer.chat_template")
    kind = "spm" if spm else "bpe"
    return Vocab(tok, kind, texts, pieces, bos, eos, frozenset(eog), str(template) if template else None)


def _token_id(value: Any) -> int | None:
    return None if value is None or int(value) < 0 else int(value)


def _gguf_bpe(meta: Mapping[str, Any], texts: list[str], source: str) -> tuple[Tokenizer, bool]:
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(
            f"{source} uses the pre-tokenizer {pre!r}, which localspec cannot reproduce, so its token ids "
            "would differ from llama.cpp's",
            "use --backend llamacpp for this file",
        )
    splits, ignore_merges, default_bos = PRE_TOKENIZERS[pre]
    merges = [tuple(str(m).split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab: dict[str, int] = {}
    for i, text in enumerate(texts):
        vocab.setdefault(text, i)  # the first id wins a duplicate text
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for a, b in merges], ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok, default_bos


def _gguf_spm(meta: Mapping[str, Any], texts: list[str], types: list[int]) -> Tokenizer:
    scores: list[float] = list(meta.get("tokenizer.ggml.scores", [0.0] * len(texts)))
    mergeable = {s: i for i, s in enumerate(texts) if types[i] in (NORMAL, USER_DEFINED)}
    # llama.cpp merges the adjacent pair whose concatenation scores highest; a BPE whose
    # merge ranks follow that score does the same.
    ranked = []
    for text, i in mergeable.items():
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    unk = _token_id(meta.get("tokenizer.ggml.unknown_token_id"))
    vocab = {s: i for i, s in reversed(list(enumerate(texts)))}  # the first id wins a duplicate text
    bpe = models.BPE(
        vocab=vocab,
        merges=[(a, b) for _, _, a, b in ranked],
        unk_token=texts[unk] if unk is not None else None,
        byte_fallback=True,
        fuse_unk=True,
    )
    tok = Tokenizer(bpe)
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "▁")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("▁"))
    tok.normalizer = normalizers.Sequence(steps)
    return tok


def _add_special_tokens(tok: Tokenizer, texts: Sequence[str], types: Sequence[int]) -> None:
    # Control tokens are matched in text only with parse_special; user-defined ones always.
    pairs = list(zip(texts, types, strict=True))
    control = [AddedToken(s, special=True, normalized=False) for s, t in pairs if t == CONTROL]
    user = [AddedToken(s, special=False, normalized=False) for s, t in pairs if t == USER_DEFINED]
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)


def _set_bos_eos(tok: Tokenizer, texts: Sequence[str], bos: int | None, eos: int | None) -> None:
    """What add_special adds: BOS in front and/or EOS behind, as the model's metadata asks."""
    if bos is None and eos is None:
        return
    pieces = [*([texts[bos]] if bos is not None else []), "$A", *([texts[eos]] if eos is not None else [])]
    specials = {texts[t]: t for t in (bos, eos) if t is not None}
    tok.post_processor = processors.TemplateProcessing(single=" ".join(pieces), special_tokens=list(specials.items()))


# -- from a Hugging Face folder ---------------------------------------------------------------


def from_folder(folder: Path, config: Mapping[str, Any]) -> Vocab:
    """The tokenizer of a Hugging Face or mlx-lm folder: tokenizer.json, plus
    tokenizer_config.json for the chat template and the special tokens."""
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(
            f"{folder} has no tokenizer.json",
            "download the model's tokenizer files too (`mlx_lm.convert` writes them), or use a GGUF file",
        )
    tok = Tokenizer.from_file(str(path))
    spec = json.loads(path.read_text(encoding="utf-8"))
    settings = _read_json(folder / "tokenizer_config.json")
    spm = "ByteLevel" not in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    n = tok.get_vocab_size(with_added_tokens=True)
    texts = [tok.id_to_token(i) or "" for i in range(n)]
    added = {int(t["id"]): bool(t.get("special")) for t in spec.get("added_tokens", [])}
    types = [_folder_type(i, s, added) for i, s in enumerate(texts)]
    pieces = [piece(s, t, spm) for s, t in zip(texts, types, strict=True)]
    bos = _folder_token(tok, settings.get("bos_token"), config.get("bos_token_id"))
    eos = _folder_token(tok, settings.get("eos_token"), config.get("eos_token_id"))
    eog = {i for i, t in enumerate(texts) if t in EOG_TEXTS}
    generation = _read_json(folder / "generation_config.json")
    for source in (config.get("eos_token_id"), generation.get("eos_token_id"), eos):
        eog.update(i for i in _as_ids(source) if 0 <= i < n)
    kind = "spm" if spm else "bpe"
    return Vocab(tok, kind, texts, pieces, bos, eos, frozenset(eog), _folder_template(folder, settings))


def _folder_type(i: int, text: str, added: Mapping[int, bool]) -> int:
    """The GGUF token type llama.cpp's converter would give this tokenizer.json entry."""
    if i in added:
        return CONTROL if added[i] or text in EOG_TEXTS else USER_DEFINED
    return BYTE if len(text) == 6 and text.startswith("<0x") and text.endswith(">") else NORMAL


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _as_ids(value: Any) -> Iterable[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _folder_token(tok: Tokenizer, setting: Any, fallback: Any) -> int | None:
    text = setting.get("content") if isinstance(setting, dict) else setting
    if isinstance(text, str) and tok.token_to_id(text) is not None:
        return tok.token_to_id(text)
    return next(iter(_as_ids(fallback)), None)


def _folder_template(folder: Path, settings: Mapping[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    template = settings.get("chat_template") or _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None
