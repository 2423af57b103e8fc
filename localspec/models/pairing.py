"""Does a drafter speak the target's tokenizer? For loaded models and for files alike. Compares
content, not just size: sibling models often differ only by padding tokens at the end of the
vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

from localspec.common.gguf_header import gguf_vocab_identity
from localspec.core.errors import PairMismatchError
from localspec.core.protocol import VocabIdentity, vocab_mismatch
from localspec.models.entries import Pair
from localspec.models.registry import Registry, load_registry


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
