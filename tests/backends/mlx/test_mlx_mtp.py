"""Qwen3.5/3.6's own MTP head drafting for its model on MLX (backends/mlx/mtp.py).

The tiny qwen3_5 folder the tests write carries random mtp.* weights beside the model's, as
the MTP conversions on the hub do; mlx-lm's loader drops them and the head reads them. Its
guesses are poor but its arithmetic is real: what matters is that the head's cache always
holds what a clean pass over the accepted text would (positions it drafted on its own
states are read again with the target's), and that the output stays exactly the target's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx: pip install 'localspec[mlx]'")
pytest.importorskip("mlx_lm.models.qwen3_5", reason="qwen3_5 needs mlx-lm 0.31 or later")

import mlx.nn as nn  # noqa: E402
from head_support import assert_calibrated_as_users_run_it  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models import qwen3_5_moe  # noqa: E402
from mlx_lm.utils import quantize_model, save_config  # noqa: E402
from test_mlx_backend import N_RUNS, TOP5, Outcome, chi_square_pvalue, exact_law, first_two  # noqa: E402
from test_mlx_hybrid import HYBRID_TEXT_CONFIG, PROMPT, lookup_prompt, save_folder, tiny_hybrid  # noqa: E402

from localspec import api  # noqa: E402
from localspec.api import runtime_for  # noqa: E402
from localspec.backends.mlx import MlxBackend, load  # noqa: E402
from localspec.backends.mlx.mtp import MlxMtpHead, MtpBlock  # noqa: E402
from localspec.core.engine import Engine  # noqa: E402
from localspec.core.errors import InvalidRequestError  # noqa: E402
from localspec.core.stats import Stats  # noqa: E402
from localspec.drafters.model import ModelDrafter  # noqa: E402


def write_mtp_weights(folder: Path, seed: int = 11) -> None:
    """Random mtp.* tensors in a safetensors file of the folder, under the checkpoint's names."""
    args = tiny_hybrid().language_model.args
    mx.random.seed(seed)
    block = MtpBlock(args)
    mx.save_safetensors(
        str(folder / "model-mtp.safetensors"), {f"mtp.{k}": v for k, v in tree_flatten(block.parameters())}
    )


@pytest.fixture(scope="module")
def with_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save_folder(tiny_hybrid(), tmp_path_factory.mktemp("mtp") / "qwen3_5-mtp")
    write_mtp_weights(folder)
    return folder


def opened(folder: Path) -> MlxBackend:
    backend = load(str(folder), n_ctx=256)
    assert isinstance(backend, MlxBackend)
    return backend


def test_mtp_sampling_follows_the_targets_law(with_head: Path) -> None:
    target = opened(with_head)
    prompt = lookup_prompt(target)
    law = exact_law(target, TOP5, prompt)
    engine = Engine(target, ModelDrafter(target.mtp_head(), min_confidence=0.0))
    observed: Counter[Outcome] = Counter()
    drafted = accepted = 0
    for run in range(N_RUNS):
        stats = Stats()
        observed[first_two(engine, TOP5, np.random.default_rng([20261126, run]), stats, prompt)] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > accepted > 0, "the runs must exercise both acceptance and rejection"
    assert chi_square_pvalue(observed, law) > 1e-3


def test_a_folder_without_mtp_weights_is_refused_with_what_to_use(tmp_path: Path) -> None:
    target = opened(save_folder(tiny_hybrid(), tmp_path / "no-head"))
    with pytest.raises(InvalidRequestError, match="no MTP head") as refused:
        target.make_self_drafter("mtp", None)
    assert refused.value.hint is not None and "MTP" in refused.value.hint


# -- auto, MoE and quantized heads ------------------------------------------------------------------


def test_a_folder_that_keeps_its_head_says_so_and_auto_drafts_with_it(with_head: Path, tmp_path: Path) -> None:
    assert opened(with_head).capabilities.extra["mtp_layers"] == "1"
    assert "mtp_layers" not in opened(save_folder(tiny_hybrid(), tmp_path / "no-head")).capabilities.extra
    with api.load(str(with_head), backend="mlx", n_ctx=256) as runtime:  # strategy and draft length "auto"
        assert runtime.label == "mtp" and runtime.draft is not None
        assert_calibrated_as_users_run_it(runtime.target, runtime.draft, runtime.policy)
        spec = runtime.generate(prompt=PROMPT, max_tokens=30, temperature=0)
    plain = runtime_for(opened(with_head), strategy="none", calibrate=False).generate(
        prompt=PROMPT, max_tokens=30, temperature=0
    )
    assert spec.tokens == plain.tokens


MOE_TEXT_CONFIG = {
    **HYBRID_TEXT_CONFIG,
    "model_type": "qwen3_5_moe",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}


def save_with_config(model: nn.Module, config: dict[str, Any], folder: Path) -> Path:
    save_folder(model, folder)
    save_config(config, folder / "config.json")
    return folder


def greedy_identity(folder: Path) -> MlxBackend:
    target = opened(folder)
    plain = runtime_for(target, strategy="none", calibrate=False).generate(prompt=PROMPT, max_tokens=40, temperature=0)
    head = target.make_self_drafter("mtp", None)
    spec = runtime_for(target, head, strategy="draft", draft_tokens=3, calibrate=False).generate(
        prompt=PROMPT, max_tokens=40, temperature=0
    )
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > 0
    return target


def test_a_moe_models_head_drafts_with_its_experts_from_hugging_faces_fused_layout(tmp_path: Path) -> None:
    config = {"model_type": "qwen3_5_moe", "text_config": MOE_TEXT_CONFIG}
    mx.random.seed(4)
    model = qwen3_5_moe.Model(qwen3_5_moe.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    folder = save_with_config(model, config, tmp_path / "qwen3_5_moe-mtp")
    block = MtpBlock(model.language_model.args)
    flat = dict(tree_flatten(block.parameters()))
    switch = "layers.0.mlp.switch_mlp"
    gate_up = mx.concatenate([flat.pop(f"{switch}.gate_proj.weight"), flat.pop(f"{switch}.up_proj.weight")], axis=-2)
    flat["layers.0.mlp.experts.gate_up_proj"] = gate_up  # as Qwen's checkpoints store them
    flat["layers.0.mlp.experts.down_proj"] = flat.pop(f"{switch}.down_proj.weight")
    mx.save_safetensors(str(folder / "model-mtp.safetensors"), {f"mtp.{k}": v for k, v in flat.items()})
    target = greedy_identity(folder)
    assert target.capabilities.extra["mtp_layers"] == "1"


def test_a_4bit_model_and_head_draft_quantized(tmp_path: Path) -> None:
    config: dict[str, Any] = {"model_type": "qwen3_5", "text_config": HYBRID_TEXT_CONFIG}
    model, config = quantize_model(tiny_hybrid(), config, group_size=32, bits=4)
    folder = save_with_config(model, config, tmp_path / "qwen3_5-mtp-4bit")
    mx.random.seed(11)
    block = MtpBlock(tiny_hybrid().language_model.args)
    nn.quantize(block, group_size=32, bits=4)
    mx.save_safetensors(
        str(folder / "model-mtp.safetensors"), {f"mtp.{k}": v for k, v in tree_flatten(block.parameters())}
    )
    target = greedy_identity(folder)
    head = target.mtp_head()
    assert isinstance(head, MlxMtpHead)
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in head._block.named_modules())


def test_mtp_weights_that_fit_no_head_are_refused_naming_what_is_missing(tmp_path: Path) -> None:
    folder = save_folder(tiny_hybrid(), tmp_path / "odd-head")
    block = dict(tree_flatten(MtpBlock(tiny_hybrid().language_model.args).parameters()))
    del block["fc.weight"]
    mx.save_safetensors(str(folder / "model-mtp.safetensors"), {f"mtp.{k}": v for k, v in block.items()})
    with pytest.raises(InvalidRequestError, match=r"do not fit a dense Qwen3.5 MTP block.*fc\.weight") as refused:
        opened(folder).make_self_drafter("mtp", None)
    assert refused.value.hint is not None and "MTP-GGUF" in refused.value.hint
