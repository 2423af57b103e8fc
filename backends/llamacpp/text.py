"""A llama.cpp target's vocabulary and text: tokenizing, each token's bytes, its end-of-
generation tokens, special tokens and chat template, read from the model's metadata."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache

from localspec.core.protocol import VocabIdentity

from .library import llama
from .state import TargetState


class TargetText(TargetState):
    """The Vocabulary side of LlamaCppBackend."""

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):  # chat templates can be long: ask again with room for all of it
            buf = ctypes.create_string_buffer(n + 1)
            llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def vocab_identity(self) -> VocabIdentity:
        self._live()
        texts = tuple((llama.llama_vocab_get_text(self._vocab, i) or b"") for i in range(self._n_vocab))
        bos = int(llama.llama_vocab_bos(self._vocab))
        eos = int(llama.llama_vocab_eos(self._vocab))
        kinds = {1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
        kind = kinds.get(int(llama.llama_vocab_type(self._vocab)), "none")
        return VocabIdentity(kind, self._n_vocab, bos if bos >= 0 else None, eos if eos >= 0 else None, texts)

    def end_of_generation(self) -> frozenset[int]:
        self._live()
        return self._eog()

    @cache  # noqa: B019 - one backend per model, lives as long as the model
    def _eog(self) -> frozenset[int]:
        return frozenset(i for i in range(self._n_vocab) if llama.llama_vocab_is_eog(self._vocab, i))

    def chat_template(self) -> str | None:
        self._live()
        return self._meta("tokenizer.chat_template")

    def special_texts(self) -> dict[str, str]:
        self._live()
        out = {}
        for name, tok in (
            ("bos_token", llama.llama_vocab_bos(self._vocab)),
            ("eos_token", llama.llama_vocab_eos(self._vocab)),
        ):
            out[name] = (llama.llama_vocab_get_text(self._vocab, tok) or b"").decode() if tok >= 0 else ""
        return out

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self._live()
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (llama.llama_token * cap)()
        n = llama.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama.llama_token * cap)()
            n = llama.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)  # a vocabulary does not change: each piece is asked for once
        if piece is None:
            self._live()
            piece = self._pieces[token] = self._piece(token)
        return piece

    def _piece(self, token: int) -> bytes:
        # A buffer per call: lanes (lanes.py) read pieces from several threads at once.
        buf = ctypes.create_string_buffer(256)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")
