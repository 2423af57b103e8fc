"""One request's sequence in a LaneHost (lanes.py): a Backend whose blocks are evaluated in
passes shared with the other lanes, with its own cache record, recurrent state and, once it
drafts with the model's MTP head, the hidden states that head reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from localspec.core.errors import InvalidRequestError, NotSharedError
from localspec.core.protocol import Backend, Logits, LogitsMode, VocabIdentity
from localspec.core.records import block_too_long, check_rollback, context_full, outside_vocabulary
from localspec.drafters import BlockDrafter

from .features import HiddenRows
from .recurrent import RecurrentRollback
from .vision import Projector, eval_runs


class Host(Protocol):
    """What a lane asks of its LaneHost (lanes.py)."""

    model: Backend
    images: Projector | None

    def evaluate(
        self, lane: Lane, tokens: list[int], logits: LogitsMode, embeddings: np.ndarray | None = None
    ) -> Logits: ...

    def drop(self, lane: Lane, n: int) -> None: ...

    def rewind(self, lane: Lane, n: int) -> int | None: ...

    def mtp_head(self, lane: Lane) -> Backend: ...

    def assistant_head(self, lane: Lane, path: str) -> Backend: ...

    def eagle3_head(self, lane: Lane, path: str) -> Backend: ...

    def block_drafter(self, lane: Lane, path: str) -> BlockDrafter: ...

    def layer_features(self, lane: Lane, ids: Sequence[int], width: int, drafter: str, kind: str) -> HiddenRows: ...

    def idle(self, lane: Lane) -> None: ...


def empty_rows(n_vocab: int) -> Logits:
    return np.empty((0, n_vocab), dtype=np.float32)


class Lane:
    """One request's sequence in a LaneHost (lanes.py): a Backend (localspec.core.protocol) whose blocks
    are evaluated in passes shared with the other lanes. Its text side is the model's."""

    def __init__(
        self, host: Host, seq: int, info: Any, capabilities: Any, state: RecurrentRollback | None = None
    ) -> None:
        """state: its sequence's recurrent state, on a model that keeps one."""
        self.host = host
        self.seq = seq
        self.info = info
        self.capabilities = capabilities
        self._model: Backend = host.model
        self._tokens: list[int] = []
        # What its heads read of the target (an MTP head's last hidden states, an EAGLE-3 head's
        # layer inputs), by what they are; every pass writes the lane's rows into each.
        self.captures: dict[object, HiddenRows] = {}
        self.state = state

    # -- the cache --------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        n = len(tokens)
        if n == 0:
            return empty_rows(self.info.n_vocab)
        if n > self.capabilities.max_block:
            raise block_too_long(n, self.capabilities.max_block)
        if len(self._tokens) + n > self.info.n_ctx:
            raise context_full(self.info.n_ctx)
        images = self.host.images
        if images is not None and images.holds(tokens):  # image positions: their runs in turn (vision.py)
            return eval_runs(images, tokens, logits, self.eval_block, self._eval_image)
        bad = next((int(t) for t in tokens if not 0 <= t < self.info.n_vocab), None)
        if bad is not None:
            raise outside_vocabulary(bad, self.info.name, self.info.n_vocab)
        return self.host.evaluate(self, list(tokens), logits)

    def _eval_image(self, rows: np.ndarray, ids: list[int], logits: LogitsMode) -> Logits:
        """An image's rows, recorded as its placeholder ids, in a pass of their own."""
        return self.host.evaluate(self, ids, logits, rows)

    def record(self, tokens: Sequence[int]) -> None:
        """What a pass added to this lane's cache (LaneHost calls it)."""
        self._tokens.extend(tokens)

    def rollback(self, n: int) -> None:
        if n < 0:
            check_rollback(n)
        if n >= len(self._tokens):
            if self.state is not None:  # nothing dropped; a drafter's run of decodes still arms a copy
                self.state.rewind(n, len(self._tokens))
                self.state.settled()
            return
        if self.state is None:
            self.host.drop(self, n)
            del self._tokens[n:]
            return
        kept = self._tokens[:n]
        start = self.host.rewind(self, n)
        if start is not None:  # the state went back further: decode what it lacks again
            del self._tokens[start:]
            step = self.capabilities.max_block
            for at in range(start, n, step):
                self.eval_block(kept[at : at + step], "none")
        del self._tokens[n:]
        self.state.settled()

    def make_self_drafter(self, kind: str, option: str | None) -> Backend:
        """SelfDrafting: the model's MTP head, drafting for this lane alone. No other drafter
        derived from the model shares passes (localspec.pool.batches says so before a load)."""
        if kind != "mtp":
            raise InvalidRequestError(
                f"requests served at once draft with the model's MTP head, not {kind}", "serve it with --parallel 1"
            )
        return self.host.mtp_head(self)

    # -- drafters in files that read the target (localspec.drafters.DrafterHost) ----------------

    def attach_head(self, kind: str, path: str) -> Backend:
        """A Gemma 4 assistant ("assistant"), reading this lane's stream of the target's KV cache,
        or an EAGLE-3 head ("eagle3"), drafting for this lane alone."""
        if kind == "assistant":
            return self.host.assistant_head(self, path)
        if kind != "eagle3":
            raise NotSharedError(f"a {kind} drafter is not served in shared passes yet", "serve it with --parallel 1")
        return self.host.eagle3_head(self, path)

    def attach_block_drafter(self, path: str) -> BlockDrafter:
        """A DFlash or DSpark drafter drafting blocks for this lane alone."""
        return self.host.block_drafter(self, path)

    def layer_features(self, ids: Sequence[int], width: int, drafter: str, kind: str) -> HiddenRows:
        """The inputs of layers `ids` at this lane's positions, for an EAGLE-3 head."""
        return self.host.layer_features(self, ids, width, drafter, kind)

    def idle(self) -> None:
        """This lane's request ended: the other lanes' passes stop waiting for it."""
        self.host.idle(self)

    def close(self) -> None:
        """The host closes the context; a lane has nothing of its own."""

    # -- images: the target's projector, shared by the lanes -----------------------------------

    def image_marker(self) -> str | None:
        """localspec.common.media.SeesImages: the text that stands for an image; None: the model
        was loaded without a projector."""
        return self.host.images.marker if self.host.images is not None else None

    def tokenize_images(self, text: str, images: Sequence[bytes], names: Sequence[str]) -> list[int]:
        if self.host.images is None:
            raise InvalidRequestError(f"{self.info.name} was loaded without a projector", "load it with --mmproj FILE")
        return self.host.images.tokenize(text, images, names)

    # -- text: the model's vocabulary ---------------------------------------------------------

    def vocab_identity(self) -> VocabIdentity:
        return self._model.vocab_identity()

    def end_of_generation(self) -> frozenset[int]:
        return self._model.end_of_generation()

    def chat_template(self) -> str | None:
        return self._model.chat_template()

    def special_texts(self) -> dict[str, str]:
        return self._model.special_texts()

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self._model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self._model.token_bytes(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._model.detokenize(tokens)
