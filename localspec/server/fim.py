"""Fill-in-the-middle prompts: a model trained for it has prefix, suffix and middle tokens
in its vocabulary, and continues `PRE prefix SUF suffix MID` with the missing middle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localspec.core.protocol import VocabIdentity

# The spellings model families use (as llama.cpp looks them up when it loads a vocabulary).
FIM_SPELLINGS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("<|fim▁begin|>", "<|fim▁hole|>", "<|fim▁end|>"),
    ("<|fim_begin|>", "<|fim_hole|>", "<|fim_end|>"),
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama
    ("<PRE>", "<SUF>", "<MID>"),
    ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),  # GLM
)


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int

    def prompt(self, prefix: str, suffix: str, tokenize: Callable[[str], list[int]], head: list[int]) -> list[int]:
        """Prefix-suffix-middle order, the one every family above was trained with, after the
        model's usual start (BOS where it adds one); the texts are tokenized as plain text
        so that they cannot smuggle in control tokens."""
        return [*head, self.prefix, *tokenize(prefix), self.suffix, *tokenize(suffix), self.middle]


def find_fim_tokens(vocab: VocabIdentity) -> FimTokens | None:
    ids = {text: i for i, text in enumerate(vocab.token_texts)}
    for spelling in FIM_SPELLINGS:
        found = [ids.get(name.encode()) for name in spelling]
        if all(i is not None for i in found):
            prefix, suffix, middle = (int(i) for i in found if i is not None)
            return FimTokens(prefix, suffix, middle)
    return None
