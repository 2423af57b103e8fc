"""Does a drafter speak the target's tokenizer? For loaded models and for files alike. Compares
content, not just size: sibling models often differ only by padding tokens at the end of the
vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localspec.errors import ModelLoadError, PairMismatchError
from localspec.protocol import VocabIdentity
from localspec.registry import Pair, Registry, load_registry

SIZE_SLACK = 128  # padding rows sibling checkpoints add to their embedding matrices
FIRST_COMPARED = 5  # the first ids are control tokens that siblings legitimately rename
# GGUF's tokenizer.ggml.model -> the vocabulary kinds llama.cpp reports (see backends/llamacpp.py)
GGUF_TOKENIZER_KINDS = {"llama": "spm", "gpt2": "bpe", "bert": "wpm", "t5": "ugm", "rwkv": "rwkv", "plamo2": "plamo2"}


def vocab_mismatch(target: VocabIdentity, draft: VocabIdentity) -> str | None:
    """None when the pair fits, else what differs in a sentence."""
    if target.kind != draft.kind:
        return f"tokenizer types differ: target {target.kind}, drafter {draft.kind}"
    if abs(target.size - draft.size) > SIZE_SLACK:
        return f"vocabulary sizes differ: target {target.size} tokens, drafter {draft.size}"
    if target.bos != draft.bos or target.eos != draft.eos:
        return f"special tokens differ: target BOS/EOS {target.bos}/{target.eos}, drafter {draft.bos}/{draft.eos}"
    for i in range(FIRST_COMPARED, min(target.size, draft.size)):
        if target.token_texts[i] != draft.token_texts[i]:
            return (
                f"token {i} differs: target {target.token_texts[i]!r}, drafter {draft.token_texts[i]!r} "
                "(different tokenizers)"
            )
    return None


def gguf_vocab_identity(path: Path) -> VocabIdentity:
    """The tokenizer a GGUF file declares (a split one's first shard holds it), as llama.cpp
    would report it once loaded."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # the gguf reader raises many kinds on a damaged header
        raise ModelLoadError(f"cannot read the GGUF header of {path}: {exc}", "pull the pair again") from exc
    return reader_vocab_identity(reader, str(path))


def reader_vocab_identity(reader: Any, where: str) -> VocabIdentity:
    """The tokenizer in a parsed GGUF header (gguf.GGUFReader); where names the file."""
    import gguf

    def scalar(key: str) -> Any:
        field = reader.fields.get(key)
        if field is None:
            return None
        value = field.parts[field.data[0]]
        if field.types[0] == gguf.GGUFValueType.STRING:
            return bytes(value).decode(errors="replace")
        return int(value[0])

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelLoadError(f"{where} has no tokenizer (no tokenizer.ggml.tokens)", "use a GGUF converted with one")
    texts = tuple(bytes(tokens.parts[i]) for i in tokens.data)
    kind = GGUF_TOKENIZER_KINDS.get(str(scalar("tokenizer.ggml.model")), "none")
    return VocabIdentity(
        kind, len(texts), scalar("tokenizer.ggml.bos_token_id"), scalar("tokenizer.ggml.eos_token_id"), texts
    )


def tokenizer_json_identity(folder: Path) -> VocabIdentity | None:
    """The tokenizer of a safetensors or MLX model folder, from its tokenizer.json (None
    when it has none). Special-token ids are not part of it: the config files hold those."""
    try:
        spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = spec.get("model", {})
    vocab = model.get("vocab", {})
    pairs = (
        [(i, text) for i, (text, _score) in enumerate(vocab)]
        if isinstance(vocab, list)
        else [(i, text) for text, i in vocab.items()]
    )
    pairs += [(t["id"], t["content"]) for t in spec.get("added_tokens", [])]
    texts = [b""] * (max((i for i, _ in pairs), default=-1) + 1)
    for i, text in pairs:
        texts[i] = text.encode()
    kinds = {"BPE": "bpe", "Unigram": "ugm", "WordPiece": "wpm", "WordLevel": "wordlevel"}
    return VocabIdentity(kinds.get(str(model.get("type")), "none"), len(texts), None, None, tuple(texts))


def check_pair_fits(pair: Pair, target: Path, drafter: Path, registry: Registry | None = None) -> None:
    """Refuse a drafter whose tokenizer differs from the target's: GGUF files, or model
    folders with a tokenizer.json (folders without one are left to the check at load)."""
    if target.is_dir():
        identities = (tokenizer_json_identity(target), tokenizer_json_identity(drafter))
        if identities[0] is None or identities[1] is None:
            return
        reason = vocab_mismatch(identities[0], identities[1])
    else:
        reason = vocab_mismatch(gguf_vocab_identity(target), gguf_vocab_identity(drafter))
    if reason is None:
        return
    assert pair.drafter is not None
    reg = registry or load_registry()
    fits = sorted(
        {p.drafter.id for p in reg.pairs.values() if p.drafter and p.drafter.family == pair.target.family}
        - {pair.drafter.id}
    )
    suggestion = f"a drafter of the {pair.target.family} family" + (f" such as {', '.join(fits)}" if fits else "")
    raise PairMismatchError(
        f"{pair.drafter.name} cannot draft for {pair.target.name} (pair {pair.id!r}): {reason}",
        f"give pair {pair.id!r} in {pair.origin} {suggestion}, or set its strategy to 'ngram'",
    )
