"""Bad input gets a LocalspecError that says what is wrong and how to fix it: never a crash,
a hang or a raw library exception. Model files are the real SmolLM2-135M and damaged or
foreign variants of it made in a temporary folder."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localspec.api import Runtime, load, runtime_for
from localspec.core.backend_loader import load_backend
from localspec.core.errors import (
    ContextFullError,
    InvalidRequestError,
    LocalspecError,
    ModelLoadError,
    PairMismatchError,
)
from localspec.core.protocol import Backend, vocab_mismatch

# llama.cpp rounds a context up to a multiple of 256; 256 itself avoids the rounding (see
# test_a_context_smaller_than_one_batch_refuses_a_long_block_instead_of_aborting).
SMALL_CTX = 256


@pytest.fixture
def llamacpp() -> None:
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python")


@pytest.fixture(scope="module")
def small_target(smollm2_q4_1: Path, load_model: Callable[..., Backend]) -> Backend:
    return load_model(smollm2_q4_1, n_ctx=SMALL_CTX)


@pytest.fixture(scope="module")
def small_drafter(derived_models: Any, load_model: Callable[..., Backend]) -> Backend:
    return load_model(derived_models["Q8_0"], n_ctx=SMALL_CTX)


@pytest.fixture
def plain_runtime(target_backend: Backend) -> Runtime:
    return runtime_for(target_backend, None, strategy="none", calibrate=False)


def load_error(path: Path) -> LocalspecError:
    with pytest.raises(ModelLoadError) as caught:
        load(str(path), strategy="none", calibrate=False)
    return caught.value


# -- model files ------------------------------------------------------------------------------


@pytest.mark.usefixtures("llamacpp")
def test_a_missing_model_file_is_named_with_a_hint(tmp_path: Path) -> None:
    error = load_error(tmp_path / "nowhere.gguf")
    assert "no model file at" in error.message and "nowhere.gguf" in error.message
    assert error.hint


@pytest.mark.usefixtures("llamacpp")
def test_a_folder_given_as_model_is_refused_with_a_hint(tmp_path: Path) -> None:
    error = load_error(tmp_path)
    assert "is a folder" in error.message
    assert error.hint and ".gguf" in error.hint


@pytest.mark.usefixtures("llamacpp")
def test_a_file_that_is_not_gguf_is_refused_with_what_it_starts_with(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b'{"__metadata__": {}}' + bytes(64))
    error = load_error(path)
    assert "is not a GGUF file" in error.message and "starts with" in error.message
    assert error.hint and "convert" in error.hint


@pytest.mark.usefixtures("llamacpp")
def test_an_empty_file_is_refused_as_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.touch()
    assert "is not a GGUF file" in load_error(path).message


def copy_head(source: Path, dest: Path, n_bytes: int) -> Path:
    with open(source, "rb") as src, open(dest, "wb") as dst:
        dst.write(src.read(n_bytes))
    return dest


@pytest.mark.model
def test_a_truncated_gguf_is_refused_as_damaged_with_a_download_hint(smollm2_q4_1: Path, tmp_path: Path) -> None:
    cut = copy_head(smollm2_q4_1, tmp_path / "cut.gguf", 50_000_000)
    error = load_error(cut)
    assert "truncated" in error.message or "cut short" in error.message
    assert error.hint and "download" in error.hint


@pytest.mark.model
def test_a_gguf_cut_inside_its_tensor_data_is_diagnosed_as_truncated_with_sizes(
    smollm2_q4_1: Path, tmp_path: Path
) -> None:
    cut = copy_head(smollm2_q4_1, tmp_path / "cut.gguf", 50_000_000)
    assert "the file is truncated" in load_error(cut).message


# -- drafter and target pairs -----------------------------------------------------------------


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> Path:
    """A one-layer random llama with its own 262-token SentencePiece vocabulary: a real model
    llama.cpp loads, whose tokenizer is nothing like SmolLM2's."""
    import gguf

    rng = np.random.default_rng(seed)
    n_embd, n_head, n_ff = 64, 4, 128
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁the", "▁a", "▁cat"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 3
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def weight(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    weight("token_embd.weight", len(tokens), n_embd)
    weight("output.weight", len(tokens), n_embd)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        weight(f"blk.0.{name}.weight", n_embd, n_embd)
    weight("blk.0.ffn_gate.weight", n_ff, n_embd)
    weight("blk.0.ffn_up.weight", n_ff, n_embd)
    weight("blk.0.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.model
def test_a_drafter_with_another_tokenizer_is_refused_naming_both_models_and_the_difference(
    target_backend: Backend, tmp_path: Path, load_model: Callable[..., Backend]
) -> None:
    foreign = load_model(write_tiny_llama_gguf(tmp_path / "tiny-random-llama.gguf"), n_ctx=256)

    with pytest.raises(PairMismatchError) as caught:
        runtime_for(target_backend, foreign, strategy="draft", calibrate=False)

    message = caught.value.message
    assert "tiny-random-llama.gguf" in message and target_backend.info.name in message
    assert "tokenizer types differ" in message
    assert caught.value.hint and "--strategy ngram" in caught.value.hint


@pytest.mark.model
def test_the_reference_backend_cannot_draft_for_a_llama_target(target_backend: Backend) -> None:
    reference = load_backend("reference", "reference")

    with pytest.raises(PairMismatchError, match="cannot draft for"):
        runtime_for(target_backend, reference, strategy="draft", calibrate=False)


@pytest.mark.model
def test_a_vocabulary_differing_in_one_token_is_a_mismatch_naming_that_token(target_backend: Backend) -> None:
    mine = target_backend.vocab_identity()
    texts = list(mine.token_texts)
    texts[1000] = b"<changed>"
    other = dataclasses.replace(mine, token_texts=tuple(texts))

    reason = vocab_mismatch(mine, other)

    assert reason is not None and "token 1000 differs" in reason
    assert vocab_mismatch(mine, mine) is None


@pytest.mark.model
def test_a_vocabulary_of_another_size_is_a_mismatch(target_backend: Backend) -> None:
    mine = target_backend.vocab_identity()
    other = dataclasses.replace(mine, size=mine.size + 1000, token_texts=mine.token_texts + (b"x",) * 1000)
    reason = vocab_mismatch(mine, other)
    assert reason is not None and "vocabulary sizes differ" in reason


# -- runtime options --------------------------------------------------------------------------


@pytest.mark.model
def test_an_unknown_strategy_is_refused_listing_the_choices(target_backend: Backend) -> None:
    with pytest.raises(InvalidRequestError, match="unknown strategy 'fastest'") as caught:
        runtime_for(target_backend, None, strategy="fastest", calibrate=False)
    assert caught.value.hint and "ngram" in caught.value.hint and "draft" in caught.value.hint


@pytest.mark.model
def test_the_draft_strategy_without_a_draft_model_names_the_option(target_backend: Backend) -> None:
    with pytest.raises(InvalidRequestError, match="needs a draft model") as caught:
        runtime_for(target_backend, None, strategy="draft", calibrate=False)
    assert caught.value.hint and "--draft-model" in caught.value.hint


@pytest.mark.model
@pytest.mark.parametrize("draft_tokens", [-1, 2.5, "many"])
def test_a_bad_draft_length_is_refused(target_backend: Backend, draft_tokens: Any) -> None:
    with pytest.raises(InvalidRequestError, match="draft_tokens"):
        runtime_for(target_backend, None, strategy="ngram", draft_tokens=draft_tokens, calibrate=False)


# -- requests ---------------------------------------------------------------------------------


@pytest.mark.model
def test_an_empty_prompt_is_refused(plain_runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        plain_runtime.generate("", max_tokens=4)


@pytest.mark.model
def test_an_empty_chat_is_refused(plain_runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="no chat messages"):
        plain_runtime.generate(messages=[], max_tokens=4)


@pytest.mark.model
def test_a_chat_message_without_content_is_refused(plain_runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="needs 'role' and 'content'"):
        plain_runtime.generate(messages=[{"role": "user"}], max_tokens=4)


@pytest.mark.model
def test_a_prompt_and_a_chat_together_are_refused(plain_runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="not both"):
        plain_runtime.generate("Hi", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)


@pytest.mark.model
def test_zero_max_tokens_returns_empty_text_finished_by_max_tokens(plain_runtime: Runtime) -> None:
    out = plain_runtime.generate("Hello", max_tokens=0)
    assert (out.text, out.tokens, out.finish_reason) == ("", [], "max_tokens")
    assert out.stats.generated_tokens == 0


@pytest.mark.model
def test_negative_max_tokens_is_refused(plain_runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens must be 0 or more"):
        plain_runtime.generate("Hello", max_tokens=-1)


@pytest.mark.model
@pytest.mark.parametrize(
    ("option", "value"),
    [("temperature", -1.0), ("temperature", math.nan), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1), ("min_p", 1.0)],
)
def test_a_bad_sampling_value_is_refused_naming_the_option(plain_runtime: Runtime, option: str, value: float) -> None:
    with pytest.raises(InvalidRequestError, match=option):
        bad: dict[str, Any] = {option: value}
        plain_runtime.generate("Hello", max_tokens=4, **bad)


@pytest.mark.model
def test_a_refused_request_leaves_the_runtime_usable(plain_runtime: Runtime) -> None:
    with pytest.raises(InvalidRequestError):
        plain_runtime.generate("Hello", max_tokens=4, top_p=0.0)
    assert plain_runtime.generate("Hello", max_tokens=2, temperature=0).stats.generated_tokens > 0


# -- the context window -----------------------------------------------------------------------


def counting_prompt(backend: Backend, max_tokens: int) -> str:
    """The longest "1, 2, 3, ..." whose tokens fit in max_tokens: text a model keeps extending."""
    best = "1"
    for k in range(2, 400):
        text = ", ".join(str(i) for i in range(1, k))
        if len(backend.tokenize(text, add_special=True, parse_special=False)) > max_tokens:
            break
        best = text
    return best


@pytest.mark.model
def test_a_prompt_longer_than_the_context_is_refused_as_context_full(small_target: Backend) -> None:
    rt = runtime_for(small_target, None, strategy="none", calibrate=False)
    prompt = "word " * (small_target.info.n_ctx + 10)

    with pytest.raises(ContextFullError, match="the context holds") as caught:
        rt.generate(prompt, max_tokens=4)

    assert caught.value.hint and "n_ctx" in caught.value.hint


@pytest.mark.model
@pytest.mark.parametrize("strategy", ["none", "ngram", "draft"])
def test_generation_that_fills_the_context_ends_with_context_full(
    small_target: Backend, small_drafter: Backend, strategy: str
) -> None:
    draft = small_drafter if strategy == "draft" else None
    rt = runtime_for(small_target, draft, strategy=strategy, draft_tokens=4, calibrate=False)
    n_ctx = small_target.info.n_ctx
    prompt = counting_prompt(small_target, n_ctx - 12)

    out = rt.generate(prompt, max_tokens=10 * n_ctx, temperature=0)

    assert out.finish_reason == "context_full"
    # The cache is full and the last token, still to be evaluated, was emitted too.
    assert out.stats.prompt_tokens + out.stats.generated_tokens == n_ctx + 1


@pytest.mark.model
def test_a_runtime_whose_context_filled_up_serves_the_next_request(small_target: Backend) -> None:
    rt = runtime_for(small_target, None, strategy="ngram", draft_tokens=3, calibrate=False)
    prompt = counting_prompt(small_target, small_target.info.n_ctx - 8)
    assert rt.generate(prompt, max_tokens=100, temperature=0).finish_reason == "context_full"

    out = rt.generate("The capital of France is", max_tokens=4, temperature=0)

    assert out.finish_reason in ("max_tokens", "stop") and out.text


ABORT_PROBE = """
import sys
from localspec.core.backend_loader import load_backend
from localspec.core.errors import LocalspecError
backend = load_backend("llamacpp", sys.argv[1], n_ctx=64)
tokens = backend.tokenize("hello " * 100, add_special=True, parse_special=False)
try:
    backend.eval_block(tokens, "none")
except LocalspecError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.model
def test_a_context_smaller_than_one_batch_refuses_a_long_block_instead_of_aborting(smollm2_q4_1: Path) -> None:
    # In a child process: the failure being guarded against kills the interpreter.
    child = subprocess.run(
        [sys.executable, "-c", ABORT_PROBE, str(smollm2_q4_1)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode in (0, 3), f"the process died (code {child.returncode}): {child.stderr[-300:]}"


def test_a_missing_model_file_in_chat_does_not_advise_another_command(capsys) -> None:
    from localspec.common.gguf_header import open_model_file
    from localspec.core.errors import ModelLoadError

    try:
        open_model_file("/tmp/nope-localspec-test.gguf")
    except ModelLoadError as exc:
        assert "localspec run" not in (exc.hint or "") and "leave the model out" in (exc.hint or "")
    else:
        raise AssertionError("a missing file opened")


def test_sampling_options_show_their_defaults_in_help() -> None:
    from localspec.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for command, longest in (("run", 512), ("chat", 1024)):
        text = " ".join(sub.choices[command].format_help().split())  # type: ignore[union-attr]
        assert "--top-k TOP_K 0 = off (default 40)" in text
        assert "--top-p TOP_P 1 = off (default 0.95)" in text
        assert "--min-p MIN_P 0 = off (default 0.05)" in text
        assert f"longest reply in tokens (default {longest})" in text
