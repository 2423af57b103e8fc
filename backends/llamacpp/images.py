"""Images on a llama.cpp target: a projector GGUF (vision.py) turns them into rows that are
decoded at their placeholder positions, recorded as those ids."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Logits, LogitsMode, PassStopped

from .state import TargetState
from .vision import EmbeddingBatch, Projector


class SeesImages(TargetState):
    """The SeesImages side of LlamaCppBackend (localspec.core.media)."""

    def see_images(self, mmproj: str) -> None:
        """Read images through the projector GGUF mmproj (vision.py); a projector that fails to
        load closes this backend: nothing stays loaded half-way."""
        try:
            if self._lane_host is not None:  # its lanes take the projector when they are made
                raise InvalidRequestError("this model's lanes were made before its projector", "read images first")
            projector = Projector(mmproj, self._model, self._options["threads"], bool(self._options["gpu_layers"]))
        except BaseException:
            self.close()
            raise
        self._images = projector, EmbeddingBatch(projector.n_embd, self.capabilities.max_block)

    def _eval_image(self, rows: np.ndarray, ids: list[int], logits: LogitsMode) -> Logits:
        """One pass over an image's rows (embeddings) at the next positions, recorded as its
        placeholder ids (vision.py)."""
        assert self._images is not None
        past, n = len(self._tokens), len(ids)
        if self._greedy.attached and logits != "none":
            self._greedy.detach()
        if self._unrecorded:
            self.rollback(past)
        if self._recurrent is not None:
            self._recurrent.before_decode(past)
        self._unrecorded, self._in_flight = True, n
        if (rc := self._images[1].decode(self._ctx, rows, past, logits == "last", logits == "all")) != 0:
            self._unrecorded = False
            if self._abort.stopped(rc):
                raise PassStopped
            raise InvalidRequestError(f"llama_decode failed with code {rc} on an image at position {past}")
        if self._recurrent is not None:
            self._recurrent.after_decode(n)
        for kept in self._recorded:
            kept.record(past, n)
        self._tokens.extend(ids)
        self._unrecorded = False
        return self._no_rows if logits == "none" else self._logits.rows(n if logits == "all" else 1)

    def image_marker(self) -> str | None:
        """localspec.core.media.SeesImages: the text that stands for an image in a prompt
        given to tokenize_images; None: loaded without a projector (--mmproj)."""
        return self._images[0].marker if self._images is not None else None

    def tokenize_images(self, text: str, images: Sequence[bytes], names: Sequence[str]) -> list[int]:
        """The ids of a rendered prompt holding image_marker() once per image: each image's
        positions as placeholder ids (vision.py)."""
        self._live()
        if self._images is None:
            raise InvalidRequestError(f"{self.info.name} was loaded without a projector", "load it with --mmproj FILE")
        return self._images[0].tokenize(text, images, names)
