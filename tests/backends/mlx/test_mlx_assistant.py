"""Gemma 4's MTP assistant drafting for its target on MLX (backends/mlx/assistant.py).

The tests write a tiny random gemma4 target (mlx-lm's own classes: sliding and full layers,
KV sharing, per-layer inputs, a window of 4 that wraps) and an assistant folder in the
layout the module doc describes. The assistant's guesses are poor, but its arithmetic is
real: it reads the target's cache and hidden states as they stand, so after any sequence of
rejected drafts it must answer what it answers over a clean pass, and the output must stay
exactly the target's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx: pip install 'localspec[mlx]'")
pytest.importorskip("mlx_lm.models.gemma4_text", reason="gemma4 needs mlx-lm 0.32 or later")

import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models import gemma4, gemma4_text  # noqa: E402
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
from test_mlx_hybrid import PROMPT, TEXT, save_folder, tiny_hybrid  # noqa: E402

from localspec import api  # noqa: E402
from localspec.api import runtime_for  # noqa: E402
from localspec.backends.mlx import MlxBackend, load  # noqa: E402
from localspec.backends.mlx.assistant import Gemma4Assistant  # noqa: E402
from localspec.core.engine import Engine  # noqa: E402
from localspec.core.errors import InvalidRequestError  # noqa: E402
from localspec.core.protocol import Backend  # noqa: E402
from localspec.core.stats import Stats  # noqa: E402
from localspec.drafters.model import ModelDrafter  # noqa: E402

VOCAB = len(TINY_TOKENS)
TARGET_TEXT: dict[str, Any] = {
    "model_type": "gemma4_text",
    "hidden_size": 64,
    "num_hidden_layers": 5,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_key_value_heads": 2,
    # Layers 3 and 4 reuse the keys of layers 2 and 1: the assistant must follow the sharing.
    "num_kv_shared_layers": 2,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": VOCAB,
    "sliding_window": 4,  # wraps within the tests' texts
    "max_position_embeddings": 256,
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
}
TARGET_CONFIG = {"model_type": "gemma4", "vocab_size": VOCAB, "text_config": TARGET_TEXT}


def assistant_config(backbone: int = 64, head_dim: int = 16, width: int = 32) -> dict[str, Any]:
    return {
        "model_type": "gemma4_assistant",
        "architectures": ["Gemma4AssistantForCausalLM"],
        "backbone_hidden_size": backbone,
        "vocab_size": VOCAB,
        "text_config": {
            "model_type": "gemma4_text",
            "hidden_size": width,
            "num_hidden_layers": 2,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "head_dim": head_dim,
            "global_head_dim": 32,
            "num_key_value_heads": 2,
            "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "hidden_size_per_layer_input": 0,
            "sliding_window": 4,
            "vocab_size": VOCAB,
        },
    }


def tiny_gemma4(seed: int = 5, sharpness: float = 1.0) -> nn.Module:
    mx.random.seed(seed)
    model = gemma4.Model(gemma4.ModelArgs.from_dict(TARGET_CONFIG))
    embed = model.language_model.model.embed_tokens
    embed.weight = embed.weight * sharpness  # tied: how peaked the next-token laws are
    mx.eval(model.parameters())
    model.eval()
    return model


def write_tokenizer(folder: Path) -> None:
    tiny_vocab().tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>"})
    )


def write_target(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, tiny_gemma4())
    save_config(TARGET_CONFIG, folder / "config.json")
    write_tokenizer(folder)
    return folder


def write_assistant(
    folder: Path, config: dict[str, Any], seed: int = 9, bits: int | None = None, agreeing: bool = False
) -> Path:
    """Random assistant weights under the checkpoint's names ("model." before the decoder's).
    agreeing: one that mostly passes the target's hidden state through to the target's own
    embedding, so it guesses what the target said last (right on repetitive text), and its
    drafts are both kept and cut; its layers still add their random part."""
    folder.mkdir(parents=True, exist_ok=True)
    text = gemma4_text.ModelArgs.from_dict({**config, **config["text_config"]})
    text.num_kv_shared_layers, text.use_double_wide_mlp = text.num_hidden_layers, False
    mx.random.seed(seed)
    module = Gemma4Assistant(text, config["backbone_hidden_size"])
    module.embed_tokens.weight = module.embed_tokens.weight * 6.0
    if agreeing:
        width = text.hidden_size
        module.embed_tokens.weight = tiny_gemma4().language_model.model.embed_tokens.weight
        module.pre_projection.weight = mx.concatenate([mx.zeros((width, width)), mx.eye(width)], axis=1)
        for layer in module.layers:
            layer.post_attention_layernorm.weight = layer.post_attention_layernorm.weight * 0.3
            layer.post_feedforward_layernorm.weight = layer.post_feedforward_layernorm.weight * 0.3
    if bits:
        nn.quantize(module, group_size=32, bits=bits)
        config = {**config, "quantization": {"group_size": 32, "bits": bits}}
    tensors = {
        (k if k.endswith("_projection.weight") else f"model.{k}"): v for k, v in tree_flatten(module.parameters())
    }
    tensors["masked_embedding.centroids"] = mx.zeros((4, 32))  # the E2B/E4B assistants carry these, unused
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("gemma4") / "gemma-4-tiny-it")


@pytest.fixture(scope="module")
def assistant_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gemma4") / "gemma-4-tiny-it-assistant"
    return write_assistant(folder, assistant_config(width=64), agreeing=True)


def opened(folder: Path) -> MlxBackend:
    backend = load(str(folder), n_ctx=256)
    assert isinstance(backend, MlxBackend)
    return backend


def test_a_gemma4_target_split_at_its_final_norm_gives_mlx_lms_logits(target_folder: Path) -> None:
    target = opened(target_folder)
    assert target.forward.gemma4
    ours = target.eval_block(TEXT, "all")
    theirs = np.array(target.model(mx.array([TEXT]))[0].astype(mx.float32))
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_after_rejected_drafts_the_assistant_answers_as_over_a_clean_pass(
    target_folder: Path, assistant_folder: Path
) -> None:
    target = opened(target_folder)
    head = target.assistant_head(str(assistant_folder))
    target.eval_block(TEXT[:7], "none")  # past the window of 4: a wrapped sliding cache
    pending = TEXT[7]
    for accepted in (1, 0, 2, 3):  # verify passes, each with its rejected tail taken back
        head.rollback(min(head.n_past, target.n_past))
        drafts = [int(np.argmax(head.eval_block([*target.cached_tokens()[head.n_past :], pending], "last")[-1]))]
        for _ in range(2):
            drafts.append(int(np.argmax(head.eval_block([drafts[-1]], "last")[-1])))
        block = [pending, 13, 14, 15]  # the target's verdict does not matter here, only the kept count
        target.eval_block(block, "all")
        target.rollback(target.n_past - len(block) + 1 + accepted)
        pending = 16 + accepted
    head.rollback(min(head.n_past, target.n_past))
    after = head.eval_block([*target.cached_tokens()[head.n_past :], pending], "last")
    kept = list(target.cached_tokens())
    clean_target = opened(target_folder)
    clean_head = clean_target.assistant_head(str(assistant_folder))
    clean_target.eval_block(kept, "none")
    clean = clean_head.eval_block([*kept, pending], "last")
    np.testing.assert_allclose(after, clean, atol=1e-4)
    # A second guess, made on the assistant's own state, also matches.
    token = int(np.argmax(after[-1]))
    np.testing.assert_allclose(head.eval_block([token], "last"), clean_head.eval_block([token], "last"), atol=1e-4)


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_assistant_drafting_reproduces_plain_decoding(
    target_folder: Path, assistant_folder: Path, gamma: int
) -> None:
    target = opened(target_folder)
    plain = runtime_for(target, strategy="none", calibrate=False).generate(prompt=PROMPT, max_tokens=60, temperature=0)
    head = target.assistant_head(str(assistant_folder))
    assert head.capabilities.extra["self_draft"] == "mtp"
    spec = runtime_for(target, head, strategy="draft", draft_tokens=gamma, calibrate=False).generate(
        prompt=PROMPT, max_tokens=60, temperature=0
    )
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > spec.stats.accepted > 0


def agreeing_prompt(target: MlxBackend, head: Backend) -> list[int]:
    """The shortest stretch of the target's greedy text after which the assistant's likeliest
    guess is the target's: drafts there are kept often, and cut often enough."""
    text = [BOS, 3, 4, 5, 6]
    for _ in range(60):
        target.rollback(0)
        text.append(int(np.argmax(target.eval_block(text, "last")[-1][1:])) + 1)  # the end token left out
    for m in range(6, len(text)):
        target.rollback(0)
        head.rollback(0)
        target.eval_block(text[: m - 1], "none")
        if int(np.argmax(head.eval_block(text[:m], "last")[-1])) == text[m]:
            target.rollback(0)
            head.rollback(0)
            return text[:m]
    raise AssertionError("the assistant never agrees with the target: pick another seed")


def test_assistant_sampling_follows_the_targets_law(target_folder: Path, assistant_folder: Path) -> None:
    target = opened(target_folder)
    head = target.assistant_head(str(assistant_folder))
    prompt = agreeing_prompt(target, head)
    law = exact_law(target, TOP5, prompt)
    engine = Engine(target, ModelDrafter(head, min_confidence=0.0))
    observed: Counter[Outcome] = Counter()
    drafted = accepted = 0
    for run in range(N_RUNS):
        stats = Stats()
        observed[first_two(engine, TOP5, np.random.default_rng([20261126, run]), stats, prompt)] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > accepted > 0, "the runs must exercise both acceptance and rejection"
    assert chi_square_pvalue(observed, law) > 1e-3


def test_load_pairs_a_target_with_its_assistant_folder_as_mtp(target_folder: Path, assistant_folder: Path) -> None:
    assert api.is_assistant(str(assistant_folder)) and not api.is_assistant(str(target_folder))
    with api.load(
        str(target_folder), draft_model=str(assistant_folder), backend="mlx", strategy="mtp", calibrate=False
    ) as runtime:
        assert runtime.label == "mtp"
        spec = runtime.generate(prompt=PROMPT, max_tokens=30, temperature=0)
    plain = runtime_for(opened(target_folder), strategy="none", calibrate=False).generate(
        prompt=PROMPT, max_tokens=30, temperature=0
    )
    assert spec.tokens == plain.tokens


def test_a_4bit_assistant_loads_quantized_and_stays_exact(target_folder: Path, tmp_path: Path) -> None:
    folder = write_assistant(tmp_path / "assistant-4bit", assistant_config(), bits=4)
    target = opened(target_folder)
    plain = runtime_for(target, strategy="none", calibrate=False).generate(prompt=PROMPT, max_tokens=40, temperature=0)
    head = target.assistant_head(str(folder))
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in head._module.named_modules())
    spec = runtime_for(target, head, strategy="draft", draft_tokens=2, calibrate=False).generate(
        prompt=PROMPT, max_tokens=40, temperature=0
    )
    assert spec.tokens == plain.tokens


def test_an_assistant_that_does_not_fit_its_target_is_refused_with_what_to_use(
    target_folder: Path, assistant_folder: Path, tmp_path: Path
) -> None:
    qwen = opened(save_folder(tiny_hybrid(), tmp_path / "qwen3_5"))
    with pytest.raises(InvalidRequestError, match="drafts for a gemma4 model") as refused:
        qwen.assistant_head(str(assistant_folder))
    assert refused.value.hint is not None and "Gemma 4 model it was made for" in refused.value.hint
    target = opened(target_folder)
    narrow = write_assistant(tmp_path / "for-another-size", assistant_config(backbone=48))
    with pytest.raises(InvalidRequestError, match="48 wide") as refused:
        target.assistant_head(str(narrow))
    assert refused.value.hint is not None and "same size" in refused.value.hint
    other_heads = write_assistant(tmp_path / "other-heads", assistant_config(head_dim=8))
    with pytest.raises(InvalidRequestError, match="heads do not match"):
        target.assistant_head(str(other_heads))
    with pytest.raises(InvalidRequestError, match="no MTP head of its own") as refused:
        target.make_self_drafter("mtp", None)
    assert refused.value.hint is not None and "assistant" in refused.value.hint


def test_a_first_token_with_nothing_decoded_yet_gets_a_draft(target_folder: Path, assistant_folder: Path) -> None:
    target = opened(target_folder)
    head = target.assistant_head(str(assistant_folder))
    row = head.eval_block([BOS], "last")
    assert row.shape == (1, VOCAB) and np.isfinite(row).all()
