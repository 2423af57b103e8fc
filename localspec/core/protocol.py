"""The contracts the engine works through: a Backend (one loaded model, a KV cache, a
tokenizer) and its optional abilities; a Drafter (proposes tokens) and a DraftLengthPolicy
(how many to propose) are in drafting.py.

The engine imports nothing but this module to talk to them; llama.cpp, torch and mlx live
behind it in localspec.backends and are imported only when a user asks for them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

# localspec/control/ reads these drafting contracts here, where they were before drafting.py.
from localspec.core.drafting import MAX_DRAFT as MAX_DRAFT
from localspec.core.drafting import Decision as Decision
from localspec.core.drafting import Draft as Draft
from localspec.core.drafting import DraftLengthPolicy as DraftLengthPolicy
from localspec.core.drafting import DraftPrices as DraftPrices

if TYPE_CHECKING:
    from pathlib import Path

    from localspec.core.sampling import Distribution, SamplingConfig

Logits = npt.NDArray[np.float32]
LogitsMode = Literal["all", "last", "none"]


@dataclass(frozen=True)
class VocabIdentity:
    """What a pair check compares: tokenizer content, not just its size."""

    kind: str  # tokenizer family, e.g. "bpe", "spm", "bytes"
    size: int
    bos: int | None
    eos: int | None
    token_texts: tuple[bytes, ...]

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for text in self.token_texts:
            digest.update(len(text).to_bytes(4, "little") + text)
        return digest.hexdigest()[:16]


SIZE_SLACK = 128  # padding rows sibling checkpoints add to their embedding matrices
FIRST_COMPARED = 5  # the first ids are control tokens that siblings legitimately rename


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


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    backend: str
    architecture: str
    n_ctx: int
    n_vocab: int
    size_bytes: int
    n_params: int
    n_layers: int = 0


@dataclass(frozen=True)
class Exactness:
    """How far a backend's verify blocks are known to give one-token passes' logits (what
    localspec.core.exactness judges each greedy request by)."""

    # Greedy speculation is plain decoding bit for bit while the context holds at most this
    # many tokens; None: at any length; 0: not known at all.
    cells: int | None
    why: str = ""  # what makes it inexact beyond `cells` (shown by run -v and bench)
    rows: int | None = None  # verify blocks longer than this are not covered (None: any)
    # A block of more tokens than this (a prompt's) takes other kernels than one-token passes
    # (None: a block of any size does not), so a cached prefix that earlier answers evaluated a
    # few tokens a pass can part from a fresh evaluation of the same text; prompt_why says which.
    prompt_rows: int | None = None
    prompt_why: str = ""
    # Blocks of at least this many rows give each row the same bits whatever their size and
    # where they start, so a prefix such blocks computed is a fresh large block's (None: not known).
    pieces_from: int | None = None


_UNKNOWN_WHY = "this backend's kernels are not known to give a block the logits of one-token passes"
UNKNOWN = Exactness(0, _UNKNOWN_WHY, prompt_rows=0, prompt_why=_UNKNOWN_WHY)


@dataclass(frozen=True)
class Capabilities:
    max_block: int = 512  # most tokens one eval_block call takes
    device: str = "cpu"
    extra: dict[str, str] = field(default_factory=dict)
    # The backend's verify_block applies the acceptance rule where its logits are (a GPU),
    # so the engine calls that instead of eval_block and localspec.core.acceptance.
    verifies: bool = False
    # Most branches one verify pass takes (TreeBackend): 1 verifies chains only (a recurrent
    # model's state cannot follow several branches at once).
    branches: int = 1
    # A kept path off the tree's first branch is evaluated again, in the cache's order
    # (llama.cpp: flash attention sums cells in their order): a pass the tree pricing charges.
    repasses_branch: bool = False
    # ... and not in a pass of its own: at the head of the next pass (llama.cpp, unless its
    # kernels split passes), which costs that pass those rows more.
    folds_branch: bool = False
    # A model with recurrent state (a hybrid) takes back up to this many rejected tokens from
    # its snapshots; rejecting more replays the kept ones (None: every rollback is free).
    replays_beyond: int | None = None
    # Whether greedy answers are plain decoding's bit for bit, from what the backend knows of
    # its kernels (localspec.core.exactness): not known unless the backend says.
    exactness: Exactness = UNKNOWN

    # extra is what a cost curve depends on (threads, build, device...), the calibration
    # cache's key; the keys read above the backends are read through these typed views.

    @property
    def self_draft(self) -> str | None:
        """The label of a drafter derived from its target ("qspec:Q4_0", "mtp"); None otherwise."""
        return self.extra.get("self_draft")

    @property
    def mtp_layers(self) -> int:
        """The model's own MTP blocks (0: none): it can draft for itself (strategy mtp)."""
        return int(self.extra.get("mtp_layers", "0") or 0)

    @property
    def gpu(self) -> str | None:
        """The GPU the model's layers went to, with how many ("NAME (N layers)"); None: none."""
        return self.extra.get("gpu")


def blocks_exact(backend: Backend) -> bool:
    """Whether a position's logits are the same whatever block it is evaluated in (the
    reference model; llama.cpp with exact kernels), so that a greedy answer cannot depend on
    how drafts cut it into blocks."""
    return backend.capabilities.extra.get("exact") == "1"


@runtime_checkable
class Vocabulary(Protocol):
    """A model's tokenizer and the texts that come with it, in llama.cpp's terms."""

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes one token stands for (may be part of a UTF-8 character)."""
        ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def vocab_identity(self) -> VocabIdentity: ...

    def end_of_generation(self) -> frozenset[int]:
        """Tokens that end a turn (EOS, EOT, <|im_end|>...)."""
        ...

    def chat_template(self) -> str | None:
        """The model's own Jinja chat template, if it ships one."""
        ...

    def special_texts(self) -> dict[str, str]:
        """bos_token / eos_token texts, as chat templates expect them."""
        ...


class TextFromVocab:
    """A Backend's text methods answered by its `vocab`: the tokenizer it built itself (torch,
    MLX) or its target's (a head that runs inside the target)."""

    vocab: Vocabulary

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self.vocab.token_bytes(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.detokenize(tokens)

    def vocab_identity(self) -> VocabIdentity:
        return self.vocab.vocab_identity()

    def end_of_generation(self) -> frozenset[int]:
        return self.vocab.end_of_generation()

    def chat_template(self) -> str | None:
        return self.vocab.chat_template()

    def special_texts(self) -> dict[str, str]:
        return self.vocab.special_texts()


@runtime_checkable
class Backend(Vocabulary, Protocol):
    """One loaded model with its own cache. Positions are counted in tokens from 0."""

    info: ModelInfo
    capabilities: Capabilities

    @property
    def n_past(self) -> int:
        """How many tokens the cache holds."""
        ...

    def cached_tokens(self) -> Sequence[int]:
        """The tokens the cache holds, in order. The cache's own record, so every user of a
        backend (engines, drafters, calibration) sees the truth and reuses shared prefixes."""
        ...

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        """Append tokens to the cache and return logits, shape (n, vocab) for "all",
        (1, vocab) for "last", (0, vocab) for "none". The array may be a view that the
        next call overwrites: copy what must outlive it."""
        ...

    def rollback(self, n: int) -> None:
        """Keep the first n cached tokens, drop the rest."""
        ...

    def close(self) -> None: ...


class PassStopped(Exception):
    """A pass a backend ended early because its stop said so (Abortable); the cache holds none
    of its tokens."""


@runtime_checkable
class Abortable(Protocol):
    """A backend that can end a pass in flight (llama.cpp's abort callback): a long prompt's
    piece then stops within a fraction of its time."""

    def aborting(self, stop: Callable[[], bool]) -> AbstractContextManager[None]:
        """While in this block, a pass ends with PassStopped once stop() says so."""
        ...


@runtime_checkable
class SharesPasses(Protocol):
    """A backend whose passes it shares with other requests' (a lane, backends/llamacpp/lanes.py):
    those passes wait for its next block until it says its request ended."""

    def idle(self) -> None: ...


@runtime_checkable
class Verifier(Protocol):
    """A backend that can verify a draft itself (Capabilities.verifies)."""

    def verify_block(
        self,
        tokens: Sequence[int],
        draft_dists: Sequence[Distribution] | None,
        cfg: SamplingConfig,
        rng: np.random.Generator,
    ) -> tuple[int, int]:
        """eval_block(tokens, "all") for tokens = [pending, *draft], then the acceptance rule
        of localspec.core.acceptance on its logits (greedy when cfg is): (number of draft tokens
        accepted, the token the target adds after them). The cache then holds all of tokens,
        as after eval_block; the caller rolls back what was not accepted."""
        ...


@runtime_checkable
class TreeBackend(Protocol):
    """A backend that verifies a tree of guesses in one pass (Capabilities.branches > 1)."""

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> Logits:
        """One pass over a tree: tokens[0] continues the cache (parents[0] == -1), every other
        token continues its parent (parents[i] < i). Returns every row's logits, each as
        eval_block of its root path would give it. The cache holds the tree until keep_branch."""
        ...

    def keep_branch(self, path: Sequence[int]) -> None:
        """After eval_tree: keep the nodes of one root path (indices, path[0] == 0), so the
        cache holds what eval_block of their tokens would have left, and nothing of the rest."""
        ...


@runtime_checkable
class SelfDrafting(Protocol):
    """A backend that derives a drafter from its own model (strategies qspec[:X] and
    layerskip[:L], see localspec.control.selfdraft): every backend but the reference one."""

    def make_self_drafter(self, kind: str, option: str | None) -> Backend:
        """The drafter for f"{kind}:{option}", or without option the one with the best
        predicted tokens/s; capabilities.self_draft holds its label ("qspec:Q4_0")."""
        ...


@runtime_checkable
class DerivesFiles(Protocol):
    """A self-drafting backend whose derived drafters are model files of their own (llama.cpp's
    GGUF copies), so that a sweep can list and open every candidate."""

    def derived_drafters(self, kind: str) -> list[tuple[str, Path]]:
        """Every candidate drafter of a kind ("qspec", "layerskip"): (label, file), derived once."""
        ...


# A prompt that can be stopped goes into a CPU backend in pieces that take about this long,
# so a cancel waits for one of them at most (issue 56); a faster machine gets larger pieces,
# which read the weights fewer times.
PIECE_SECONDS = 0.05
# llama.cpp's flash attention sums a block of fewer rows another way (kernels.py), so pieces
# are multiples of this and none falls under it where a whole block would not: pieces then
# give whole blocks' bits.
BLOCK_KERNEL_ROWS = 64


def eval_chunked(
    backend: Backend,
    tokens: Sequence[int],
    logits: Literal["last", "none"],
    stop: Callable[[], bool] | None = None,
    tail: int | None = None,
    tail_rows: int = 0,
) -> Logits:
    """eval_block over any number of tokens, in max_block's blocks from the first token;
    logits (if asked) are those of the last piece. stop is asked before each piece: once it
    says so the rest is left out and no rows come back. With a stop, a CPU backend's blocks
    go in pieces of PIECE_SECONDS (64 rows first), so a long prompt is abandoned within one.
    tail: one token more, evaluated in the last piece with its row's logits (that one row
    comes back) where the piece then holds at most tail_rows rows; else it is left out. The
    pieces of `tokens` are the same either way."""
    step = backend.capabilities.max_block
    cut = stop is not None and backend.capabilities.device == "cpu"
    piece = BLOCK_KERNEL_ROWS if cut else step
    start = 0
    none = np.empty((0, backend.info.n_vocab), dtype=np.float32)
    # A backend that can end a pass in flight does so once stop() says so: a piece deep in a
    # long context takes far longer than PIECE_SECONDS.
    guard = backend.aborting(stop) if stop is not None and isinstance(backend, Abortable) else nullcontext()
    with guard:
        while True:
            if stop is not None and stop():
                return none
            left = min(step - start % step, len(tokens) - start)  # rows left in this block
            size = left if left < piece + BLOCK_KERNEL_ROWS else piece
            try:
                if start + size >= len(tokens):
                    if tail is not None and len(tokens) - start < min(tail_rows, step):
                        return backend.eval_block([*tokens[start:], tail], "last")
                    return backend.eval_block(tokens[start:], logits)
                t0 = time.perf_counter()
                backend.eval_block(tokens[start : start + size], "none")
            except PassStopped:
                return none
            start += size
            if cut:
                rows = int(size / max(time.perf_counter() - t0, 1e-6) * PIECE_SECONDS)
                piece = min(max(rows // BLOCK_KERNEL_ROWS, 1) * BLOCK_KERNEL_ROWS, step)
