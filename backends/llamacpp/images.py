"""Images on a llama.cpp target: a projector GGUF (vision.py) turns them into rows that are
decoded at their placeholder positions, recorded as those ids."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Logits, LogitsMode, PassStopped

from .state import TargetState
from .vision import EmbeddingBatch, Projector, image_in_parts


class SeesImages(TargetState):
    """The SeesImages side of LlamaCppBackend (localspec.common.media)."""

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
        self._images = projector, EmbeddingBatch(projector.n_embd, self.capabilities.max_block, projector.sections)
        self._places = projector.places
        if self._recurrent is not None:
            self._recurrent.places = projector.places

    def _eval_image(self, rows: np.ndarray, ids: list[int], logits: LogitsMode, whole: bool = False) -> Logits:
        """One pass over an image's rows (embeddings) at the next positions, recorded as its
        placeholder ids (vision.py); whole: all its rows, attending to each other."""
        assert self._images is not None
        image, row = self._images[0].image_of(ids[0])
        if image.whole and not whole:
            return self._eval_whole(ids, row, logits)
        past, n = len(self._tokens), len(ids)
        if self._greedy.attached and logits != "none":
            self._greedy.detach()
        if self._unrecorded:
            self.rollback(past)
        if self._recurrent is not None:
            self._recurrent.before_decode(past, n)
        self._unrecorded, self._in_flight = True, n
        at = self._images[0].positions(past, ids)
        if (rc := self._images[1].decode(self._ctx, rows, at, logits, causal=not whole)) != 0:
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

    def _eval_whole(self, ids: list[int], row: int, logits: LogitsMode) -> Logits:
        """Rows of an image read whole (Gemma 3): the rows decoded with its first come off
        _ahead; a first pass decodes every row, records those asked for, holds the rest."""
        assert self._images is not None
        if self._ahead[: len(ids)] == tuple(ids) and logits == "none":
            self._tokens.extend(ids)
            self._ahead = self._ahead[len(ids) :]
            self._unrecorded = bool(self._ahead)
            return self._no_rows
        image, _ = self._images[0].image_of(ids[0])
        if row > 0 or (len(ids) < image.n and logits != "none") or image.n > self.capabilities.max_block:
            raise image_in_parts(image.n, self.capabilities.max_block)
        every = [image.first - r for r in range(image.n)]
        out = self._eval_image(self._images[0].embeddings(image), every, logits, whole=True)
        del self._tokens[len(self._tokens) - image.n + len(ids) :]
        self._ahead = tuple(every[len(ids) :])
        self._unrecorded = bool(self._ahead)
        return out

    def image_marker(self) -> str | None:
        """localspec.common.media.SeesImages: the text that stands for an image in a prompt
        given to tokenize_images; None: loaded without a projector (--mmproj)."""
        return self._images[0].marker if self._images is not None else None

    def tokenize_images(self, text: str, images: Sequence[bytes], names: Sequence[str]) -> list[int]:
        """The ids of a rendered prompt holding image_marker() once per image: each image's
        positions as placeholder ids (vision.py)."""
        self._live()
        if self._images is None:
            raise InvalidRequestError(f"{self.info.name} was loaded without a projector", "load it with --mmproj FILE")
        return self._images[0].tokenize(text, images, names)
