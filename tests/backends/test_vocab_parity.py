"""Every backend tokenizes as llama.cpp does: the torch and MLX backends build their tokenizer
from the GGUF's metadata (backends/vocab.py), and a drafter pairs with a target across
backends only if both give the same ids, the same bytes per token and the same
end-of-generation set as llama.cpp reading the same file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.common.gguf_header import gguf_vocab_identity
from localspec.core.backend_loader import load_backend
from localspec.core.errors import BackendUnavailableError
from localspec.core.protocol import Backend

pytestmark = pytest.mark.model

TEXTS = [
    # the torch backend's samples
    "Hello world! The quick brown fox jumps over 12345 lazy dogs.",
    "def f(x):\n    return x**2  # square\n\n\n",
    "Ünïcödé — 日本語 テキスト 🙂  spaces   and\ttabs",
    "<|im_start|>user\nhi<|im_end|>\n",
    "don't won't I'll they're 3.14159 1,000,000",
    # the MLX backend's samples
    "Hello world",
    " leading space, trailing space ",
    "numbers 12345 and 3.14159, dates 2024-06-11",
    "def f(x):\n    return x**2\n\n\n",
    "naïve café — “quotes” 日本語 🙂 émoji👍🏽",
    "<|im_start|>user\nHi<|im_end|>\n",
    "tabs\tand  double  spaces   \r\n\r\n x",
    "I'm you're they'll WE'LL",
    "<reponame>x<file_sep>y",
    # whitespace runs alone, and an end-of-generation text inside ordinary text
    "       \n\n\n\t\t  ",
    "the end<|endoftext|>and after",
]


@pytest.fixture(scope="module", params=["torch", "mlx"])
def backend(request: pytest.FixtureRequest, smollm2_q4_1: Path) -> Iterator[Backend]:
    try:
        loaded = load_backend(request.param, str(smollm2_q4_1), n_ctx=256, threads=1)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    yield loaded
    loaded.close()


@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("add_special", [False, True])
def test_token_ids_match_llamacpp(
    backend: Backend, target_backend: Backend, add_special: bool, parse_special: bool
) -> None:
    for text in TEXTS:
        ids = backend.tokenize(text, add_special=add_special, parse_special=parse_special)
        assert ids == target_backend.tokenize(text, add_special=add_special, parse_special=parse_special), text
        assert backend.detokenize(ids) == target_backend.detokenize(ids)


def test_every_token_stands_for_the_same_bytes(backend: Backend, target_backend: Backend) -> None:
    n = target_backend.info.n_vocab
    assert backend.info.n_vocab == n
    assert [backend.token_bytes(t) for t in range(n)] == [target_backend.token_bytes(t) for t in range(n)]


def test_vocabulary_end_of_generation_and_specials_match_llamacpp(backend: Backend, target_backend: Backend) -> None:
    assert backend.vocab_identity() == target_backend.vocab_identity()
    assert backend.end_of_generation() == target_backend.end_of_generation()
    assert backend.special_texts() == target_backend.special_texts()
    assert backend.chat_template() == target_backend.chat_template()


def test_the_pair_checks_header_reader_sees_llamacpps_vocabulary(smollm2_q4_1: Path, target_backend: Backend) -> None:
    assert gguf_vocab_identity(smollm2_q4_1) == target_backend.vocab_identity()
