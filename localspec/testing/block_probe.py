"""What this process's llama.cpp computes for one text evaluated in blocks of other sizes: the
last position's logits after the prefix went in blocks of n rows, against one-token passes,
against other cuts into pieces of 64+ rows (the prompt pieces eval_chunked makes), and against
a prefix kept from another text's 64+-row block with the rest in a 64+-row block of its own (a
cached prefix reused, localspec.core.reuse). Run in a child process, so a CPU variant
(localspec.tooling.cpu_variants) can be swapped in:

    python -m localspec.testing.block_probe MODEL.gguf [MODEL.gguf ...]   # prints JSON
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.library import llama

TEXT = "The river runs to the sea, and the quick brown fox jumps over the lazy dog by its bank. " * 40
ELSEWHERE = " ".join(f"Ticket {i} was filed in room {i * 7 % 13}." for i in range(40))
SHORT = 128  # a prompt evaluated in blocks of BLOCKS rows and in one-token passes
BLOCKS = (2, 7, 8, 63, 64, 128)
LONG = 400  # a prompt cut into pieces of 64+ rows in several ways
PIECES = ((64, 336), (128, 64, 208), (192, 208))
# A prefix of k rows kept from a block of k + OTHER rows over another text, the rest of LONG
# after it in one block (each rest 64+ rows, as the engine's rule asks).
KEPT = (1, 26, 100, 336)
OTHER = 80


def _last_logits(backend: LlamaCppBackend, tokens: Sequence[int], pieces: Sequence[int]) -> np.ndarray:
    """The last token's logits after tokens[:-1] went in as the given pieces."""
    backend.rollback(0)
    at = 0
    for size in pieces:
        backend.eval_block(tokens[at : at + size], "none")
        at += size
    assert at == len(tokens) - 1
    return np.array(backend.eval_block(tokens[-1:], "last")[-1])


def _kept_then_rest(backend: LlamaCppBackend, tokens: Sequence[int], kept: int, other: Sequence[int]) -> np.ndarray:
    """The last token's logits where tokens[:kept] stayed cached from a block over another
    text that shares them, and the rest of tokens[:-1] went in as one block after them."""
    backend.rollback(0)
    backend.eval_block([*tokens[:kept], *other], "none")
    backend.rollback(kept)
    backend.eval_block(tokens[kept:-1], "none")
    return np.array(backend.eval_block(tokens[-1:], "last")[-1])


def _cut(n: int, size: int) -> list[int]:
    return [size] * (n // size) + ([n % size] if n % size else [])


def probe(path: str) -> dict[str, Any]:
    backend = LlamaCppBackend(path, n_ctx=1024, threads=2)
    try:
        tokens = backend.tokenize(TEXT, add_special=False, parse_special=False)
        short = tokens[: SHORT + 1]
        one = _last_logits(backend, short, [1] * SHORT)
        blocks = {n: float(np.abs(_last_logits(backend, short, _cut(SHORT, n)) - one).max()) for n in BLOCKS}
        long = tokens[: LONG + 1]
        whole = _last_logits(backend, long, [LONG])
        pieces = {"+".join(map(str, p)): float(np.abs(_last_logits(backend, long, p) - whole).max()) for p in PIECES}
        other = backend.tokenize(ELSEWHERE, add_special=False, parse_special=False)[:OTHER]
        kept = {k: float(np.abs(_kept_then_rest(backend, long, k, other) - whole).max()) for k in KEPT}
        known = backend.capabilities.exactness
        return {
            "prompt_rows": known.prompt_rows,
            "blocks_vs_one_token": blocks,
            "pieces_vs_whole": pieces,
            "kept_vs_whole": kept,
        }
    finally:
        backend.close()


def main(paths: Sequence[str]) -> None:
    system = (llama.llama_print_system_info() or b"").decode()
    print(json.dumps({"system_info": system, "models": {p: probe(p) for p in paths}}))


if __name__ == "__main__":
    main(sys.argv[1:])
