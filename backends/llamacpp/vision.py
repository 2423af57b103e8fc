"""Images into a llama.cpp target's context, through llama.cpp's mtmd (a projector GGUF, --mmproj).

An image takes as many positions in the context as its projector makes embeddings. In the
token record (and in every prompt the engine sees) each of those positions holds a
placeholder id: a negative number, never a vocabulary row, so a drafter's guess of one is
refused like any id the target cannot evaluate (proposal.admissible). Each distinct image
(its decoded pixels' digest) gets ids of its own, never given to another image in the
backend's life: a cached prefix holding an image matches a new prompt only where the same
pixels sit at the same positions, which is all the engine's prefix reuse compares.

Images are mostly decoded causally: a position's cache entry depends on the positions before
it alone, as a token's does, so a rollback into an image keeps its first rows as valid as a text
prefix, and the rest are decoded again from the embeddings kept here. Two layouts are read:

- linear (the LLaVA family's): an image's rows take the next positions, one each;
- M-RoPE (a target whose rotation has time, height and width sections: Qwen2-VL to Qwen3.5):
  an image's rows share one time position and sit on its grid (height, width), and the text
  after it continues max(nx, ny) positions later, fewer than its nx * ny rows. Record index and
  position then part (Places): the cache is cut by position (seq_rm), and as all of an image's
  rows share one, a rollback into an image removes it whole and decodes its first rows again.

An image whose rows attend to each other (Gemma 3's, causal attention off while it is decoded)
goes into the cache whole, in one pass: a pass that asks for its first rows decodes them all
and holds the rest past the record for the pass that asks for them; a rollback into it takes
it whole and decodes it again.

Audio takes the same path: mtmd tells a clip from an image by its bytes, and a projector with
an audio encoder (Qwen2-Audio's "qwen2a", Ultravox's) makes each 30 s window of it a chunk of
rows at linear positions, an image's here in all but their source (M-RoPE targets: refused).
"""

from __future__ import annotations

import ctypes
import functools
import os
import secrets
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from localspec.common.media import AUDIO_FORMATS, FORMATS, audio_format, check_audio, check_image
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Logits, LogitsMode

from . import compute, library

llama = library.llama

# Encoded images kept for reuse and for decoding rows again after a rollback; an image
# dropped from here gets new ids when it comes again (its cached positions are not reused).
KEPT_IMAGES = 16

_T = TypeVar("_T")
_P = ParamSpec("_P")

# mtmd_input_chunk types
_TEXT, _IMAGE, _AUDIO = 0, 1, 2


@cache
def _mtmd() -> Any:
    """llama-cpp-python's mtmd binding, its logs as quiet as llama.cpp's (library.py)."""
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError) as exc:  # a llama-cpp-python built without libmtmd
        raise ModelLoadError(
            f"this llama-cpp-python has no libmtmd ({exc}), which images need",
            "install llama-cpp-python 0.3.36 or later: pip install -U 'localspec[llamacpp]'",
        ) from None
    mtmd_cpp.mtmd_log_set(library._quiet_log, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(library._quiet_log, ctypes.c_void_p(0))
    return mtmd_cpp


# -- the projector and the images it has read ----------------------------------------------------


@dataclass
class _Image:
    """One distinct image: its placeholder ids (first, count), and its embeddings once encoded
    (until then the mtmd chunk that encodes it)."""

    first: int  # the id of its first position; position r holds first - r
    n: int
    nx: int = 0  # rows per line of its grid (M-RoPE), 0: linear
    n_pos: int = 0  # the positions it advances the context by: n, or max(nx, ny) on M-RoPE's grid
    whole: bool = False  # its rows attend to each other (Gemma 3): decoded all at once, causal attention off
    chunk: Any = None  # an mtmd_input_chunk copy, freed once encoded
    rows: np.ndarray | None = None  # (n, n_embd) float32


def _one_at_a_time(method: Callable[Concatenate[Projector, _P], _T]) -> Callable[Concatenate[Projector, _P], _T]:
    """A Projector method that waits for any other thread's: lanes (lanes.py) and a server's
    prompt reading share one mtmd context, which is not safe to call concurrently."""

    @functools.wraps(method)
    def locked(self: Projector, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class Projector:
    """A projector GGUF read by llama.cpp's mtmd beside a loaded target: prompts with images
    become token ids with placeholder positions (tokenize), and blocks holding placeholders
    are decoded from the images' embeddings (runs, embeddings)."""

    _lock = threading.RLock()  # every projector's: images are rare enough not to need one each

    def __init__(self, path: str, model: Any, threads: int, gpu: bool) -> None:
        if not os.path.isfile(path):
            raise ModelLoadError(f"no projector file at {path}", "check the path given to --mmproj")
        self._m = m = _mtmd()
        params = m.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.warmup = gpu, threads, False
        self._threads = threads
        # A marker of this load's own, so no text a user sends can stand for an image.
        self.marker = f"<__localspec_image_{secrets.token_hex(8)}__>"
        self._marker_bytes = self.marker.encode()
        params.media_marker = self._marker_bytes
        self._ctx = m.mtmd_init_from_file(os.fsencode(path), model, params)
        n_embd = int(llama.llama_model_n_embd_inp(model))  # wider than n_embd where a target reads deepstack rows
        if not self._ctx:
            raise ModelLoadError(
                f"llama.cpp could not load the projector {path}",
                f"give the projector (mmproj) made for this model: its output must be {n_embd} wide, "
                "as the model's embeddings are",
            )
        self.n_embd = n_embd
        self.name = os.path.basename(path)
        # What its encoders read: images, audio (an audio projector: Qwen2-Audio's, Ultravox's), or both.
        self.sees, self.hears = bool(m.mtmd_support_vision(self._ctx)), bool(m.mtmd_support_audio(self._ctx))
        # The target's rotation decides: M-RoPE targets place images on their grid (Places).
        self.places = Places() if m.mtmd_decode_use_mrope(self._ctx) else None
        self.sections = 1 if self.places is None else 4  # positions per image row
        # The projector's type decides (no chunk asked): Gemma 3's images are read whole.
        self.reads_whole = bool(m.mtmd_decode_use_non_causal(self._ctx, None))
        # Placeholder ids, counting down; never reused (see the module's docstring).
        self._next = -1
        self._by_digest: dict[bytes, _Image] = {}
        self._by_id: dict[int, tuple[_Image, int]] = {}

    # -- prompts -------------------------------------------------------------------------------

    @_one_at_a_time
    def tokenize(self, text: str, images: Sequence[bytes], names: Sequence[str]) -> list[int]:
        """The ids of text with self.marker where each image goes (special tokens parsed, as a
        rendered chat's markup is)."""
        if text.count(self.marker) != len(images):
            raise InvalidRequestError(
                f"the prompt marks {text.count(self.marker)} image(s) but {len(images)} were given",
                "give one image per image part",
            )
        for data, name in zip(images, names, strict=True):
            self._check(data, name)
        bitmaps = [self._bitmap(data, name) for data, name in zip(images, names, strict=True)]
        try:
            return self._tokens(text, bitmaps)
        finally:
            for bitmap in bitmaps:
                self._m.mtmd_bitmap_free(bitmap)

    def _check(self, data: bytes, name: str) -> None:
        """Refuse what this projector's encoders do not read, before any decoder sees it."""
        kind = audio_format(data)
        if kind is None:
            check_image(data, name)
        else:
            check_audio(data, name)
        if kind is not None and not self.hears:
            raise InvalidRequestError(
                f"{name} is audio, but the projector {self.name} reads images only",
                "load the model with a projector that has an audio encoder (--mmproj), or send text and images only",
            )
        if kind is None and not self.sees:
            raise InvalidRequestError(
                f"{name} is an image, but the projector {self.name} reads audio only",
                "send the image to a vision model, or send text and audio only",
            )

    def _bitmap(self, data: bytes, name: str) -> Any:
        m = self._m
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        opt = m.mtmd_helper_init_opt_default()
        # A corrupt image falls through to mtmd's video probe: a folder that holds no ffprobe,
        # so that no program is ever run on what a request sent.
        opt.video_params.ffmpeg_bin_dir = b"/nonexistent/localspec-no-ffmpeg"
        bitmap = m.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False, opt)
        if not bitmap:
            formats = AUDIO_FORMATS if audio_format(data) else FORMATS
            raise InvalidRequestError(
                f"{name} could not be decoded (truncated or corrupt)", f"send the whole file, as {formats}"
            )
        return bitmap

    def _tokens(self, text: str, bitmaps: Sequence[Any]) -> list[int]:
        m = self._m
        raw = text.encode("utf-8")
        given = m.mtmd_input_text(text=raw, text_len=len(raw), add_special=False, parse_special=True)
        array = (m.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
        chunks = m.mtmd_input_chunks_init()
        try:
            if (rc := m.mtmd_tokenize(self._ctx, chunks, ctypes.byref(given), array, len(bitmaps))) != 0:
                raise InvalidRequestError(f"llama.cpp's mtmd could not read the prompt's images (code {rc})")
            tokens: list[int] = []
            seen: dict[bytes, int] = {}  # a clip past 30 s comes as several chunks of one digest
            for i in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, i)
                tokens += self._chunk_ids(chunk, seen)
            return tokens
        finally:
            m.mtmd_input_chunks_free(chunks)

    def _chunk_ids(self, chunk: Any, seen: dict[bytes, int]) -> list[int]:
        m = self._m
        n = int(m.mtmd_input_chunk_get_n_tokens(chunk))
        kind = m.mtmd_input_chunk_get_type(chunk)
        if kind == _TEXT:
            count = ctypes.c_size_t(0)
            ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            return [int(ids[i]) for i in range(count.value)]
        if kind == _AUDIO and self.places is not None:
            raise InvalidRequestError(
                "audio on an M-RoPE target (Qwen2.5-Omni's kind) is not read by localspec yet",
                "send the audio to a model whose positions are linear (Qwen2-Audio, Ultravox, Voxtral)",
            )
        n_pos = int(m.mtmd_input_chunk_get_n_pos(chunk))
        if self.places is None and n_pos != n:
            raise InvalidRequestError(
                f"this projector places an image's {n} rows at {n_pos} positions, a layout localspec does not read",
                "load the model without --mmproj",
            )
        digest = self._digest(chunk)
        seen[digest] = part = seen.get(digest, -1) + 1
        image = self._image(chunk, digest + part.to_bytes(4, "little"), n, n_pos)
        image.whole = bool(m.mtmd_decode_use_non_causal(self._ctx, chunk))
        return [image.first - r for r in range(image.n)]

    def _image(self, chunk: Any, digest: bytes, n: int, n_pos: int) -> _Image:
        """The image (or 30 s window of audio) this chunk holds, registered once per distinct
        digest of its bytes and its place among the chunks they make."""
        image = self._by_digest.pop(digest, None)
        if image is None:
            tokens = self._m.mtmd_input_chunk_get_tokens_image(chunk)  # none for audio: its rows are linear
            nx = int(self._m.mtmd_image_tokens_get_nx(tokens)) if tokens else 0
            copy = self._m.mtmd_input_chunk_copy(chunk)
            image = _Image(self._next, n, nx if self.places is not None else 0, n_pos, chunk=copy)
            self._next -= n
            self._by_id.update({image.first - r: (image, r) for r in range(n)})
        self._by_digest[digest] = image  # last: the most recently used
        while len(self._by_digest) > KEPT_IMAGES:
            self._forget(next(iter(self._by_digest)))
        return image

    def _digest(self, chunk: Any) -> bytes:
        # mtmd names an image chunk by the SHA-256 of the bytes it was decoded from: the same
        # bytes, the same ids (and the cached positions reused); other bytes, other ids.
        digest = self._m.mtmd_input_chunk_get_id(chunk)
        if not digest:
            raise InvalidRequestError("llama.cpp's mtmd gave an image no digest", "update llama-cpp-python")
        return bytes(digest)

    def _forget(self, digest: bytes) -> None:
        image = self._by_digest.pop(digest)
        for r in range(image.n):
            del self._by_id[image.first - r]
        self._free_chunk(image)

    def _free_chunk(self, image: _Image) -> None:
        if image.chunk is not None:
            self._m.mtmd_input_chunk_free(image.chunk)
            image.chunk = None

    # -- evaluation ----------------------------------------------------------------------------

    @staticmethod
    def holds(tokens: Sequence[int]) -> bool:
        return min(tokens) < 0

    def image_of(self, t: int) -> tuple[_Image, int]:
        """The image a placeholder id belongs to, and its row."""
        return self._by_id[t]

    def cut_start(self, tokens: Sequence[int], n: int) -> int | None:
        """Where the image starts that a rollback to n would cut in two, where its first rows
        cannot stay alone: on M-RoPE's grid (its rows share a position) or attended to whole
        (Gemma 3: each row read the rest). None: n cuts no such image."""
        t = tokens[n] if n < len(tokens) else 0
        if t >= 0 or t not in self._by_id:
            return None
        image, row = self._by_id[t]
        return n - row if row > 0 and (self.places is not None or image.whole) else None

    def positions(self, past: int, ids: Sequence[int]) -> np.ndarray:
        """The positions of an image pass (rows ids, the first at record index past): one per
        row in a line, or M-RoPE's four sections, section-major (time, height, width, unused)."""
        if self.places is None:
            return np.arange(past, past + len(ids), dtype=np.int32)
        image, row = self._by_id[ids[0]]
        return self.places.image_rows(past, image, row, len(ids))

    @_one_at_a_time
    def runs(self, tokens: Sequence[int]) -> list[tuple[_Image | None, list[int]]]:
        """tokens cut into runs: (None, text ids) and (image, its row indices), in order."""
        parts: list[tuple[_Image | None, list[int]]] = []
        for t in tokens:
            image, row = self._by_id.get(t, (None, -1)) if t < 0 else (None, t)
            if t < 0 and image is None:
                raise InvalidRequestError(
                    f"position id {t} names no image this model holds", "send the request again with its images"
                )
            if parts and parts[-1][0] is image and (image is None or row == parts[-1][1][-1] + 1):
                parts[-1][1].append(row)
            else:
                parts.append((image, [row]))
        return parts

    @_one_at_a_time
    def embeddings(self, image: _Image) -> np.ndarray:
        """The image's rows for the target, encoded by the projector on first use."""
        if image.rows is None:
            m = self._m
            if (rc := compute.run(self._threads, m.mtmd_encode_chunk, self._ctx, image.chunk)) != 0:
                raise InvalidRequestError(f"llama.cpp's projector failed to encode an image (code {rc})")
            out = m.mtmd_get_output_embd(self._ctx)
            image.rows = np.ctypeslib.as_array(out, shape=(image.n * self.n_embd,)).reshape(image.n, -1).copy()
            self._free_chunk(image)
        return image.rows

    def close(self) -> None:
        for digest in list(self._by_digest) if hasattr(self, "_by_digest") else []:
            self._forget(digest)
        if self._ctx:
            self._m.mtmd_free(self._ctx)
            self._ctx = None


def image_in_parts(rows: int, max_block: int) -> InvalidRequestError:
    """An image read whole (Gemma 3) asked for in a way one pass cannot give."""
    if rows > max_block:
        return InvalidRequestError(
            f"an image of {rows} rows is read whole, in one pass, but a pass takes at most {max_block}",
            f"load the model with max_block={rows} or more (llama.cpp's batch)",
        )
    return InvalidRequestError(
        "an image read whole (its rows attend to each other) was asked for from its middle, or for its "
        "inner rows' logits",
        "evaluate the image from its first row, and ask for logits after it",
    )


class Places:
    """Where a record's entries sit on an M-RoPE target's time axis: text one position each;
    an image's rows all at the time position where it starts (its grid in the height and
    width sections), the text after it max(nx, ny) later. Kept as the images in the record,
    in order: (record index of row 0, its time position, the image)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, _Image]] = []

    def at(self, n: int) -> int:
        """The time position of record index n: the next text's there, or for a row of an
        image its start's (all its rows share it)."""
        i = bisect_right(self._starts, n) - 1
        if i < 0:
            return n
        start, t0, image = self._spans[i]
        if n < start + image.n:
            return t0
        return t0 + image.n_pos + (n - start - image.n)

    def inside(self, n: int) -> int | None:
        """The record index where an image starts that index n cuts in two; None: n is not
        inside an image."""
        i = bisect_right(self._starts, n) - 1
        if i < 0:
            return None
        start, _, image = self._spans[i]
        return start if start < n < start + image.n else None

    def cut(self, n: int) -> None:
        """The record holds n entries now: images from n on are gone."""
        k = bisect_right(self._starts, n - 1) if n > 0 else 0
        del self._starts[k:], self._spans[k:]

    def image_rows(self, past: int, image: _Image, row: int, n: int) -> np.ndarray:
        """Rows row.. row+n of image, the first at record index past, in four sections as
        llama.cpp's mtmd places them (mtmd_image_tokens_get_decoder_pos)."""
        if row == 0:
            self.cut(past)
            self._spans.append((past, self.at(past), image))
            self._starts.append(past)
        start, t0, held = self._spans[-1]
        assert held is image and start + row == past, "an image's rows continue where its last pass ended"
        r = np.arange(row, row + n, dtype=np.int32)
        return np.concatenate([np.full(n, t0, np.int32), t0 + r // image.nx, t0 + r % image.nx, np.zeros(n, np.int32)])


class EmbeddingBatch:
    """A llama_batch of embeddings (rows in place of token ids) for one context, reused; its
    positions are four per row for an M-RoPE target (section-major, as llama_batch takes them)."""

    def __init__(self, n_embd: int, max_block: int, sections: int = 1) -> None:
        self._batch = llama.llama_batch_init(max_block, n_embd, 1)
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(max_block, n_embd))
        # Room for every section's positions: the batch's own array holds one per row.
        self._pos_type = type(self._batch.pos)
        self._own_pos = ctypes.cast(self._batch.pos, ctypes.c_void_p).value  # the address, not a view of the field
        self._pos = np.zeros(max_block * sections, dtype=np.int32)
        self._batch.pos = self._pos.ctypes.data_as(self._pos_type)
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(max_block,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(max_block,))[:] = 1
        for i in range(max_block):
            self._batch.seq_id[i][0] = 0

    def decode(
        self, ctx: Any, rows: np.ndarray, positions: np.ndarray, logits: LogitsMode, causal: bool = True, seq: int = 0
    ) -> int:
        """One pass over sequence seq (a lane's, backends/llamacpp/lanes.py); causal False: every
        row attends to every other (an image read whole)."""
        n = len(rows)
        for i in range(n):
            self._batch.seq_id[i][0] = seq
        self._embd[:n] = rows
        self._pos[: len(positions)] = positions
        self._out[:n] = 1 if logits == "all" else 0
        if logits == "last":
            self._out[n - 1] = 1
        self._batch.n_tokens = n
        if causal:
            return compute.decode(ctx, self._batch)
        llama.llama_set_causal_attn(ctx, False)
        try:
            return compute.decode(ctx, self._batch)
        finally:
            llama.llama_set_causal_attn(ctx, True)

    def free(self) -> None:
        self._batch.pos = ctypes.cast(ctypes.c_void_p(self._own_pos), self._pos_type)  # llama_batch_free frees its own
        llama.llama_batch_free(self._batch)


def eval_runs(
    projector: Projector,
    tokens: Sequence[int],
    logits: LogitsMode,
    text: Callable[[list[int], LogitsMode], Logits],
    image: Callable[[np.ndarray, list[int], LogitsMode], Logits],
) -> Logits:
    """A block holding image positions, as consecutive passes (a pass takes ids or
    embeddings, never both): text runs through `text`, image runs through `image`; the rows
    asked for come back as one block's would."""
    parts = projector.runs(tokens)
    rows: list[Logits] = []
    out: Logits | None = None
    for k, (img, ids) in enumerate(parts):
        mode: LogitsMode = logits if logits != "last" or k == len(parts) - 1 else "none"
        if img is None:
            out = text(ids, mode)
        else:
            out = image(projector.embeddings(img)[ids], [img.first - r for r in ids], mode)
        if logits == "all":
            rows.append(np.array(out))
    assert out is not None
    return np.concatenate(rows) if logits == "all" else out
