"""`localspec export` of a pair with a vision projector: vLLM and SGLang read the projector from
the target's checkpoint, so they get their own switches for images, spelled as documented.

- vLLM: `--limit-mm-per-prompt JSON` (vllm/config/multimodal.py, MultiModalConfig.limit_per_prompt:
  "The maximum number of input items ... allowed per prompt for each modality. Defaults to 999",
  e.g. {"image": 16, "video": 2}); `--language-model-only` (docs.vllm.ai, models/supported_models:
  "a text-only mode can be enabled ... using --language-model-only"). vLLM refuses a draft model
  or parallel drafting beside a multimodal target ("Speculative Decoding with draft models or
  parallel drafting does not support multimodal models yet", vllm#42005; vllm#33458).
- SGLang: `--enable-multimodal` (python/sglang/srt/server_args.py: "Enable the multimodal
  functionality for the served model. If the model being served is not multimodal, nothing
  will happen").
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from localspec.models.export import export_pair
from localspec.models.registry import Pair, load_registry

VLLM_VISION_FLAGS = {"--limit-mm-per-prompt", "--language-model-only"}
VLLM_MODALITIES = {"image", "video", "audio"}
SGLANG_VISION_FLAGS = {"--enable-multimodal"}

# (pair, strategy) exported with vLLM's image limits: drafters that vLLM runs on a multimodal target.
SEES_IMAGES = [("smollm2-135m", None), ("qwen3.6-27b", None), ("llama-3.1-8b", "eagle3")]
# ... and those vLLM refuses beside one: a draft model, DFlash, Gemma 4's MTP assistant.
TEXT_ONLY = [("smollm2-1.7b", None), ("qwen3.6-27b-dflash", None), ("gemma-4-31b", None)]


def seeing(name: str) -> Pair:
    """The packaged pair, with a projector for its target (its own, or as if models.toml named one)."""
    registry = load_registry()
    projector = next(iter(registry.models.values()))  # any model: vLLM and SGLang never read the file
    return replace(registry.pair(name), mmproj=registry.pair(name).mmproj or projector)


def blind(name: str) -> Pair:
    """The packaged pair as if models.toml named no projector for its target."""
    return replace(load_registry().pair(name), mmproj=None)


def vision_flags(argv: tuple[str, ...], known: set[str]) -> dict[str, str]:
    return {a: argv[i + 1] if a == "--limit-mm-per-prompt" else "" for i, a in enumerate(argv) if a in known}


@pytest.mark.parametrize(("name", "strategy"), SEES_IMAGES)
def test_vllm_takes_images_and_no_video_where_its_drafter_runs_on_a_multimodal_target(
    name: str, strategy: str | None
) -> None:
    out = export_pair(seeing(name), "vllm", strategy=strategy)
    limits = json.loads(vision_flags(out.argv, VLLM_VISION_FLAGS)["--limit-mm-per-prompt"])
    assert set(limits) <= VLLM_MODALITIES
    assert limits["image"] >= 1 and limits["video"] == 0
    assert "--language-model-only" not in out.argv


@pytest.mark.parametrize(("name", "strategy"), TEXT_ONLY)
def test_vllm_serves_text_only_where_it_refuses_the_drafter_beside_a_multimodal_target(
    name: str, strategy: str | None
) -> None:
    out = export_pair(seeing(name), "vllm", strategy=strategy)
    assert vision_flags(out.argv, VLLM_VISION_FLAGS) == {"--language-model-only": ""}
    note = next(n for n in out.notes if "--language-model-only" in n)
    assert "vllm#33458" in note and "--to llama-server" in note and "--strategy ngram" in note


@pytest.mark.parametrize(("name", "strategy"), [*SEES_IMAGES, *TEXT_ONLY, ("qwen3-8b", "eagle3")])
def test_sglang_enables_its_multimodal_path(name: str, strategy: str | None) -> None:
    argv = export_pair(seeing(name), "sglang", strategy=strategy).argv
    assert [a for a in argv if a in SGLANG_VISION_FLAGS] == ["--enable-multimodal"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(("name", "strategy"), [*SEES_IMAGES, *TEXT_ONLY])
def test_a_pair_without_a_projector_gets_no_vision_settings(engine: str, name: str, strategy: str | None) -> None:
    argv = export_pair(blind(name), engine, strategy=strategy).argv
    assert not set(argv) & (VLLM_VISION_FLAGS | SGLANG_VISION_FLAGS)
