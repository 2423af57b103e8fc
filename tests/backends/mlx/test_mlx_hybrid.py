"""Hybrid targets on MLX: Qwen3.5/3.6's Gated DeltaNet (recurrent) layers beside attention,
and sliding windows that have wrapped around.

Neither cache can be trimmed to a position, so a rejected draft is taken back through marks
of the cache's state (backends/mlx/rollback.py): a mark per position of a short block for
the qwen3_5 family, which then replays nothing, or a mark before the block and a replay of
the kept tokens. Each must leave the model where a clean pass over the kept tokens leaves
it, and every strategy must stay lossless on top. The models are tiny random-weight
qwen3_5 and gemma3 models built from mlx-lm's own classes, the hybrid saved as a folder.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx: pip install 'localspec[mlx]'")
pytest.importorskip("mlx_lm.models.qwen3_5", reason="qwen3_5 needs mlx-lm 0.31 or later")

import mlx.nn as nn  # noqa: E402
from mlx_lm.models import gemma3_text, qwen3_5  # noqa: E402
from mlx_lm.utils import save_config, save_model  # noqa: E402
from test_mlx_backend import (  # noqa: E402
    BOS,
    N_RUNS,
    TINY_TOKENS,
    TOP5,
    Outcome,
    chi_square_pvalue,
    exact_law,
    first_two,
    tiny_vocab,
)

from localspec.api import runtime_for  # noqa: E402
from localspec.backends.mlx import Forward, MlxBackend, load  # noqa: E402
from localspec.core.engine import Engine  # noqa: E402
from localspec.core.protocol import Backend  # noqa: E402
from localspec.core.stats import Stats  # noqa: E402
from localspec.drafters.model import ModelDrafter  # noqa: E402
from localspec.drafters.ngram import NgramDrafter  # noqa: E402

TEXT = [BOS, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
HYBRID_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,  # three Gated DeltaNet layers, then attention
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "vocab_size": len(TINY_TOKENS),
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
    "rope_parameters": {
        "type": "default",
        "mrope_section": [2, 1, 1],
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
    },
}


def tiny_hybrid(seed: int = 0, sharpness: float = 6.0) -> nn.Module:
    """A random qwen3_5 model with peaked next-token laws (few outcome cells)."""
    mx.random.seed(seed)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({"model_type": "qwen3_5", "text_config": HYBRID_TEXT_CONFIG}))
    head = model.language_model.lm_head
    head.weight = head.weight * sharpness
    mx.eval(model.parameters())
    model.eval()
    return model


def perturbed(model: nn.Module, noise: float, seed: int = 7) -> nn.Module:
    """A copy of model with noise added to every weight: a drafter that mostly agrees."""
    copy = tiny_hybrid()
    mx.random.seed(seed)
    flat = [(k, v + noise * mx.random.normal(v.shape) * v.std()) for k, v in _flat(model)]
    copy.load_weights(flat)
    mx.eval(copy.parameters())
    return copy


def _flat(model: nn.Module) -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    return [(k, v) for k, v in tree_flatten(model.parameters()) if isinstance(v, mx.array)]


def backend(model: nn.Module, stepwise: bool | None = None) -> MlxBackend:
    return MlxBackend(
        Forward(model, stepwise=stepwise),
        tiny_vocab(),
        name="tiny-qwen3_5",
        path="tiny",
        architecture="qwen3_5",
        n_ctx=256,
    )


def save_folder(model: nn.Module, folder: Path) -> Path:
    """model as an mlx-lm folder: config.json, safetensors and a tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, model)
    save_config({"model_type": "qwen3_5", "text_config": HYBRID_TEXT_CONFIG}, folder / "config.json")
    tiny_vocab().tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>"})
    )
    return folder


@pytest.fixture(scope="module")
def hybrid_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_folder(tiny_hybrid(), tmp_path_factory.mktemp("qwen3_5") / "target")


def clean_rows(model: nn.Module, tokens: list[int], rows: int) -> np.ndarray:
    """The last rows of a fresh model's pass over tokens: where no rollback happened."""
    return backend(model).eval_block(tokens, "all")[-rows:].copy()


WAYS = {"per-position": True, "snapshot-replay": False}


@pytest.mark.parametrize("stepwise", WAYS.values(), ids=WAYS.keys())
def test_a_rejected_draft_leaves_a_hybrid_where_a_clean_pass_over_the_kept_tokens_does(stepwise: bool) -> None:
    model = tiny_hybrid()
    target = backend(model, stepwise)
    target.eval_block(TEXT[:6], "none")
    for _ in range(3):  # verify blocks, each with rejected tokens taken back
        kept = target.n_past + 2
        target.eval_block([13, 14, 15, 16, 17], "all")
        target.rollback(kept)
        after = target.eval_block([7, 8], "all").copy()
        np.testing.assert_allclose(after, clean_rows(model, list(target.cached_tokens()), 2), atol=1e-5)


def test_a_qwen3_5_verify_block_is_taken_back_without_a_replay() -> None:
    # The per-position marks are the cheaper way (benchmarks/mlx_hybrid_rollback.py).
    target = backend(tiny_hybrid())
    assert target.forward.stepwise
    target.eval_block(TEXT[:6], "none")
    target.eval_block([13, 14, 15, 16, 17], "all")
    target.rollback(8)
    assert target._marks is not None and target._marks.replayed == 0


@pytest.mark.parametrize("stepwise", WAYS.values(), ids=WAYS.keys())
def test_a_hybrid_drafter_takes_back_drafts_made_one_token_at_a_time(stepwise: bool) -> None:
    model = tiny_hybrid()
    drafter = backend(model, stepwise)
    drafter.eval_block(TEXT[:6], "none")
    for accepted in (1, 0, 2):
        start = drafter.n_past
        for token in (20, 21, 22):  # a draft model proposes one token per pass
            drafter.eval_block([token], "last")
        drafter.rollback(start + accepted)
        after = drafter.eval_block([9, 10], "all").copy()
        np.testing.assert_allclose(after, clean_rows(model, list(drafter.cached_tokens()), 2), atol=1e-5)
    assert drafter._marks is not None and drafter._marks.replayed == 0  # a mark at every token


def test_going_back_behind_every_mark_replays_the_kept_prefix() -> None:
    model = tiny_hybrid()
    target = backend(model)
    target.eval_block(TEXT, "none")
    for token in range(2, 22):  # enough single steps to push the early marks out
        target.eval_block([token], "none")
    target.rollback(3)  # another request that shares only the first 3 tokens
    after = target.eval_block([12, 13], "all").copy()
    np.testing.assert_allclose(after, clean_rows(model, [*TEXT[:3], 12, 13], 2), atol=1e-5)


def test_an_interrupted_block_is_taken_back_before_the_next_one() -> None:
    # Ctrl+C between the pass and the record: the cache ran ahead of the tokens it lists.
    model = tiny_hybrid()
    target = backend(model)
    target.eval_block(TEXT[:6], "none")
    target._unrecorded = True
    target.forward.hidden(mx.array([[13, 14, 15]]), target._cache)
    after = target.eval_block([7, 8], "all").copy()
    np.testing.assert_allclose(after, clean_rows(model, [*TEXT[:6], 7, 8], 2), atol=1e-5)


def tiny_gemma3(window: int = 4) -> nn.Module:
    mx.random.seed(3)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        head_dim=16,
        num_key_value_heads=2,
        vocab_size=len(TINY_TOKENS),
        query_pre_attn_scalar=16,
        sliding_window=window,
        sliding_window_pattern=2,  # a sliding layer, then a global one
    )
    model = gemma3_text.Model(args)
    mx.eval(model.parameters())
    return model


def test_a_wrapped_sliding_window_rolls_back_like_a_clean_pass() -> None:
    model = tiny_gemma3()

    def window_backend() -> MlxBackend:
        return MlxBackend(Forward(model), tiny_vocab(), name="tiny-gemma3", path="g", architecture="gemma3", n_ctx=64)

    rolled = window_backend()
    rolled.eval_block(TEXT, "none")  # 11 tokens through a window of 4
    for token in (5, 6, 7):
        rolled.eval_block([token], "none")
    assert not all(c.is_trimmable() for c in rolled._cache)  # the window has wrapped
    for kept_after in (1, 0, 2):
        start = rolled.n_past
        rolled.eval_block([13, 14, 15], "all")
        rolled.rollback(start + kept_after)
        after = rolled.eval_block([9], "all").copy()
        np.testing.assert_allclose(
            after, window_backend().eval_block(list(rolled.cached_tokens()), "all")[-1:], atol=1e-4
        )


# -- every strategy stays lossless on a hybrid target ----------------------------------------------

PROMPT = "abcabcab"


@pytest.fixture(scope="module")
def drafter_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_folder(perturbed(tiny_hybrid(), 0.3), tmp_path_factory.mktemp("qwen3_5") / "drafter")


@pytest.mark.parametrize("strategy", ["ngram", "draft"])
def test_greedy_speculation_on_a_hybrid_folder_reproduces_plain_decoding(
    strategy: str, hybrid_folder: Path, drafter_folder: Path
) -> None:
    target = load(str(hybrid_folder), n_ctx=256)
    assert target.info.architecture == "qwen3_5"
    plain = runtime_for(target, None, strategy="none", calibrate=False).generate(
        prompt=PROMPT, max_tokens=60, temperature=0
    )
    drafter = load(str(drafter_folder), n_ctx=256) if strategy == "draft" else None
    rt = runtime_for(target, drafter, strategy=strategy, draft_tokens=4, calibrate=False)
    spec = rt.generate(prompt=PROMPT, max_tokens=60, temperature=0)
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > spec.stats.accepted > 0  # drafts both kept and cut


def lookup_prompt(target: Backend) -> list[int]:
    """The shortest stretch of the target's greedy text where lookup's guess is the target's
    likeliest next token: drafts there are kept often, and cut often enough."""
    start = [BOS, 3, 4, 5, 6]
    text = list(start)
    target.rollback(0)
    for _ in range(60):  # greedy, the end token left out so the text runs on
        row = target.eval_block(text[target.n_past :], "last")[-1]
        text.append(int(np.argmax(row[1:])) + 1)
    guesser = NgramDrafter()
    for m in range(len(start) + 1, len(text)):
        guess = guesser.propose(text[:m], 2, TOP5, np.random.default_rng(0)).tokens
        if len(guess) and guess[0] == text[m]:
            return text[:m]
    raise AssertionError("the greedy text never repeats itself: pick another seed")


def engine_for(kind: str, target: Backend, folder: Path) -> Engine:
    if kind == "ngram":
        return Engine(target, NgramDrafter())
    return Engine(target, ModelDrafter(load(str(folder), n_ctx=256)))


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_speculative_sampling_on_a_hybrid_target_follows_the_targets_law(kind: str, drafter_folder: Path) -> None:
    target = backend(tiny_hybrid())
    prompt = lookup_prompt(target)
    law = exact_law(target, TOP5, prompt)
    engine = engine_for(kind, target, drafter_folder)
    observed: Counter[Outcome] = Counter()
    drafted = accepted = 0
    for run in range(N_RUNS):
        stats = Stats()
        observed[first_two(engine, TOP5, np.random.default_rng([20261126, run]), stats, prompt)] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > accepted > 0, "the runs must exercise both acceptance and rejection"
    assert chi_square_pvalue(observed, law) > 1e-3
