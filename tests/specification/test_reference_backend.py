"""The reference backend is a real Backend: a byte tokenizer and a cache that behave like a
model's, with logits that are a pure function of the cached text."""

from __future__ import annotations

import jinja2
import numpy as np
import pytest

from localspec.backends.reference import BOS, END_OF_TURN, EOS, ReferenceBackend, load
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend
from localspec.core.sampling import SamplingConfig, process

TEXT = [BOS, 5, 9, 3, 7, 7, 12, 4, 200, 31]


def test_implements_the_backend_protocol() -> None:
    assert isinstance(ReferenceBackend(), Backend)


def test_detokenize_inverts_tokenize_for_any_utf8_text() -> None:
    backend = ReferenceBackend()
    text = "héllo, wörld 🙂 <|im_start|>\n\x00"
    tokens = backend.tokenize(text, add_special=True, parse_special=True)
    assert tokens[0] == BOS
    assert backend.detokenize(tokens) == text
    assert b"".join(backend.token_bytes(t) for t in tokens) == text.encode()


def test_special_tokens_have_no_text_and_end_generation() -> None:
    backend = ReferenceBackend()
    assert [backend.token_bytes(t) for t in (BOS, EOS, END_OF_TURN)] == [b"", b"", b""]
    assert backend.end_of_generation() == {EOS, END_OF_TURN}


def test_eval_block_rows_equal_one_token_at_a_time() -> None:
    block, single = ReferenceBackend(), ReferenceBackend()
    rows = block.eval_block(TEXT, "all")
    one_by_one = np.concatenate([single.eval_block([t], "all") for t in TEXT])
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows, one_by_one)


# logits modes and a full context: test_backend_contract.py


def test_rollback_then_reeval_gives_identical_logits() -> None:
    backend = ReferenceBackend()
    first = backend.eval_block(TEXT, "all")
    backend.rollback(4)
    assert list(backend.cached_tokens()) == TEXT[:4]
    again = backend.eval_block(TEXT[4:], "all")
    np.testing.assert_array_equal(again, first[4:])


def test_logits_are_the_pure_two_token_lookup() -> None:
    backend = ReferenceBackend()
    rows = backend.eval_block(TEXT, "all")
    expected = [backend.next_token_logits(TEXT[i - 1] if i else BOS, TEXT[i]) for i in range(len(TEXT))]
    np.testing.assert_array_equal(rows, np.stack(expected))


def test_exact_probs_is_the_processed_target_row() -> None:
    backend, cfg = ReferenceBackend(), SamplingConfig(temperature=0.7, top_k=5)
    row = backend.eval_block(TEXT, "last")[0]
    np.testing.assert_array_equal(backend.exact_probs(TEXT, cfg), process(row, cfg).dense(259))


def test_a_block_past_n_ctx_is_refused_and_leaves_the_cache_alone() -> None:
    backend = ReferenceBackend(n_ctx=8)
    backend.eval_block(TEXT[:6], "none")
    with pytest.raises(InvalidRequestError, match="context of 8 tokens is full"):
        backend.eval_block(TEXT[6:9], "last")
    assert backend.n_past == 6


def test_a_noisy_drafter_shares_the_tokenizer_but_not_the_logits() -> None:
    target, drafter = ReferenceBackend(seed=3), ReferenceBackend(seed=3, noise=0.5)
    assert drafter.vocab_identity() == target.vocab_identity()
    assert not np.array_equal(drafter.eval_block(TEXT), target.eval_block(TEXT))


def test_chat_template_renders_chatml() -> None:
    backend = ReferenceBackend()
    template = jinja2.Template(backend.chat_template() or "")
    rendered = template.render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_load_parses_a_spec_and_info_path_loads_the_same_model() -> None:
    backend = load("reference:seed=3,vocab=16,noise=0.5", n_ctx=64, threads=2)
    assert (backend.info.n_vocab, backend.info.n_ctx) == (16, 64)
    again = load(backend.info.path)
    np.testing.assert_array_equal(again.next_token_logits(4, 5), backend.next_token_logits(4, 5))


def test_load_lets_the_spec_override_runtime_options() -> None:
    assert load("reference:n_ctx=64", n_ctx=4096).info.n_ctx == 64


def test_load_names_an_unknown_option() -> None:
    with pytest.raises(InvalidRequestError, match="'temprature'"):
        load("reference:seed=1,temprature=3")
