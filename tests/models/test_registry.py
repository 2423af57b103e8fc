"""models.toml: the packaged pairs, strict validation naming file, entry and key, and the
user's file merged over the packaged one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from repo_paths import ROOT

from localspec.models.default_model import DEFAULT_MODEL
from localspec.models.entries import HubArtifact, PyPIArtifact
from localspec.models.registry import (
    RegistryError,
    UnknownPairError,
    load_registry,
    packaged_registry_file,
    user_registry_file,
)
from localspec.testing.fakehub import model_toml, pair_toml

REPO_ROOT = ROOT

MODEL = model_toml("mine", "me/mine-GGUF", ["mine.gguf"], "1B", family="qwen2.5")
PAIR = pair_toml(
    "my-pair", "mine, drafted by Qwen2.5 0.5B", "mine", "draft", drafter="qwen2.5-0.5b-instruct", draft_tokens=5
)


def write_user_file(text: str) -> Path:
    path = user_registry_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_wheel_ships_the_top_level_models_toml_unchanged() -> None:
    assert packaged_registry_file().read_bytes() == (REPO_ROOT / "models.toml").read_bytes(), (
        "copy models.toml to localspec/models.toml"
    )


def test_the_packaged_registry_has_the_consumer_pairs() -> None:
    registry = load_registry()
    wanted = {
        "qwen2.5-7b": ("Qwen2.5-7B-Instruct", "Qwen2.5-0.5B-Instruct"),
        "llama-3.1-8b": ("Llama-3.1-8B-Instruct", "Llama-3.2-1B-Instruct"),
        "smollm2-1.7b": ("SmolLM2-1.7B-Instruct", "SmolLM2-135M-Instruct"),
        "qwen2.5-coder-7b": ("Qwen2.5-Coder-7B-Instruct", "Qwen2.5-Coder-0.5B-Instruct"),
        "gemma-3-12b": ("gemma-3-12b-it", "gemma-3-1b-it"),
        "qwen3-8b": ("Qwen3-8B", "Qwen3-0.6B"),
        "llama-3.2-3b": ("Llama-3.2-3B-Instruct", "Llama-3.2-1B-Instruct"),
    }
    for pair_id, (target, drafter) in wanted.items():
        pair = registry.pair(pair_id)
        assert (pair.target.name, pair.drafter.name if pair.drafter else None) == (target, drafter)
        assert pair.drafter is not None and pair.drafter.family == pair.target.family
        assert "llamacpp" in pair.backends


def test_gemma_3_12b_has_an_mlx_entry() -> None:
    artifact = load_registry().pair("gemma3").target.artifacts["mlx"]
    assert isinstance(artifact, HubArtifact) and artifact.repo == "mlx-community/gemma-3-12b-it-4bit"


def test_qwen2_5_coder_7b_names_a_single_file_that_exists() -> None:
    artifact = load_registry().models["qwen2.5-coder-7b-instruct"].artifacts["llamacpp"]
    assert isinstance(artifact, HubArtifact)
    assert (artifact.repo, [f.name for f in artifact.files]) == (
        "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF",
        ["Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf"],
    )


def test_confirmed_pins_are_carried() -> None:
    models = load_registry().models
    smollm2 = models["smollm2-1.7b-instruct"].artifacts["llamacpp"]
    coder = models["qwen2.5-coder-0.5b-instruct"].artifacts["llamacpp"]
    qwen = models["qwen2.5-7b-instruct"].artifacts["llamacpp"]
    assert isinstance(smollm2, HubArtifact) and isinstance(coder, HubArtifact) and isinstance(qwen, HubArtifact)
    assert smollm2.pinned and smollm2.files[0].size == 1055609536
    assert coder.pinned and coder.files[0].sha256 == "e1a77721fa97d412f121878223eec81fb4ae6f271e18f922d746711f67b344d1"
    assert qwen.files[0].sha256 == "65b8fcd92af6b4fefa935c625d1ac27ea29dcb6ee14589c55a8f115ceaaa1423"


def test_draft_tokens_may_be_left_out_for_auto() -> None:
    write_user_file(MODEL + PAIR.replace("draft_tokens = 5\n", ""))
    assert load_registry().pair("my-pair").draft_tokens == "auto"


def test_the_default_pair_is_the_embedded_default_model() -> None:
    pair = load_registry().pair("default")
    artifact = pair.target.artifacts["llamacpp"]
    assert pair.id == "smollm2-135m" and pair.drafter is None and pair.strategy == "ngram"
    assert isinstance(artifact, PyPIArtifact) and artifact.source == DEFAULT_MODEL


def test_every_hub_file_names_an_exact_gguf_for_llamacpp() -> None:
    for model in load_registry().models.values():
        artifact = model.artifacts.get("llamacpp")  # an MLX-only model (a Gemma 4 assistant repo) has none
        if isinstance(artifact, HubArtifact):
            assert all(f.name.endswith(".gguf") and not f.is_pattern for f in artifact.files), model.id


def test_a_user_file_adds_pairs_that_use_packaged_models() -> None:
    write_user_file(MODEL + PAIR)
    registry = load_registry()
    pair = registry.pair("my-pair")
    assert pair.drafter is registry.models["qwen2.5-0.5b-instruct"]
    assert pair.origin == user_registry_file()
    assert "qwen2.5-7b" in registry.pairs


def test_a_user_entry_replaces_the_packaged_one_with_the_same_id() -> None:
    write_user_file(PAIR.replace("my-pair", '"qwen2.5-7b"').replace('"mine"', '"qwen2.5-7b-instruct"'))
    registry = load_registry()
    assert registry.pair("qwen2.5-7b").draft_tokens == 5
    with pytest.raises(UnknownPairError):  # replaced whole: the packaged aliases went with it
        registry.pair("qwen2.5")


def test_an_unknown_pair_suggests_a_close_one() -> None:
    with pytest.raises(UnknownPairError, match=r"no pair named 'qwen2.5-7' in") as refused:
        load_registry().pair("qwen2.5-7")
    assert str(refused.value.hint).startswith("did you mean qwen2.5")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            MODEL + PAIR.replace("draft_tokens = 5", "draft_tokens = 5\ncolour = 'red'"),
            "pair 'my-pair': key 'colour': unknown key",
        ),
        (
            MODEL + PAIR.replace('description = "mine, drafted by Qwen2.5 0.5B"\n', ""),
            "pair 'my-pair': key 'description': missing",
        ),
        (
            MODEL + PAIR.replace("draft_tokens = 5", "draft_tokens = 0"),
            "pair 'my-pair': key 'draft_tokens': expected 'auto' or a whole number from 1 to 16, got 0",
        ),
        (
            MODEL + PAIR.replace('"draft"', '"magic"'),
            "pair 'my-pair': key 'strategy': expected one of auto, none, ngram, draft",
        ),
        (MODEL + PAIR.replace('target = "mine"', 'target = "nope"'), "pair 'my-pair': key 'target': no model 'nope'"),
        (
            MODEL + PAIR.replace('drafter = "qwen2.5-0.5b-instruct"\n', ""),
            "pair 'my-pair': key 'drafter': missing: strategy 'draft' needs a drafter",
        ),
        (
            MODEL + PAIR + 'aliases = ["qwen2.5"]',
            "pair 'my-pair': key 'aliases': 'qwen2.5' already names pair 'qwen2.5-7b'",
        ),
        (MODEL.replace('params = "1B"\n', ""), "model 'mine': key 'params': missing"),
        (MODEL.replace("me/mine-GGUF", "mine"), "model 'mine', backend 'llamacpp': key 'repo': 'mine' does not match"),
        (
            MODEL.replace('["mine.gguf"]', '["*.gguf"]'),
            "model 'mine', backend 'llamacpp': key 'files': llama.cpp needs exact .gguf",
        ),
        (
            MODEL.replace('["mine.gguf"]', '[{ name = "mine.gguf", sha256 = "abc" }]'),
            r"model 'mine', backend 'llamacpp', files\[0\]: key 'sha256': expected 64 lowercase hex",
        ),
        (
            MODEL.replace('["mine.gguf"]', '[{ name = "mine.gguf", size = -1 }]'),
            r"model 'mine', backend 'llamacpp', files\[0\]: key 'size': expected a size in bytes > 0, got -1",
        ),
        (MODEL.replace("llamacpp =", "onnx ="), "model 'mine': key 'onnx': unknown key"),
        (
            MODEL.replace('{ repo = "me/mine-GGUF", revision = "main", files = ["mine.gguf"] }', '{ path = "m.bin" }'),
            "model 'mine', backend 'llamacpp': key 'path': llama.cpp needs a .gguf file",
        ),
        ("[pairs]\n[moodels]\n", "the file: key 'moodels': unknown key"),
    ],
)
def test_a_bad_user_file_is_refused_naming_file_entry_and_key(text: str, message: str) -> None:
    path = write_user_file(text)
    with pytest.raises(RegistryError, match=f"^{re.escape(str(path))}: {message}"):
        load_registry()


def test_a_file_that_is_not_toml_is_refused_with_its_path() -> None:
    path = write_user_file("[pairs\n")
    with pytest.raises(RegistryError, match=f"^{re.escape(str(path))}: not valid TOML"):
        load_registry()
