"""`localspec export` of an MTP pair: each engine's own MTP settings, spelled as its current
documentation spells them.

- vLLM: docs.vllm.ai features/speculative_decoding/mtp ("MTP (Multi-Token Prediction)"):
  `vllm serve MODEL --speculative-config '{"method": "mtp", "num_speculative_tokens": N}'`,
  no draft model; "mtp" replaced the per-model names (qwen3_next_mtp, deepseek_mtp) in
  vllm/config/speculative.py. Its "Gemma 4 Assistant Models" section: the assistant
  checkpoint goes in the same config's "model" with "method": "mtp" (not draft_model),
  named as Google names it (ai.google.dev gemma/docs/mtp: the target's id + "-assistant").
- SGLang: docs.sglang.io advanced_features/speculative_decoding ("Multi Token Prediction")
  and basic_usage/deepseek ("Multi-token Prediction"): `--speculative-algorithm EAGLE
  --speculative-num-steps N --speculative-eagle-topk 1 --speculative-num-draft-tokens N+1`
  with no draft model path; NEXTN is the older alias of EAGLE. Gemma 4's assistant: SGLang's
  Gemma 4 cookbook and sgl-project/sglang#24436 (`--speculative-algorithm NEXTN` with the
  assistant as `--speculative-draft-model-path`, promoted to FROZEN_KV_MTP; topk 1,
  num-draft-tokens = num-steps + 1).
- llama-server: llama.cpp common/arg.cpp (`--spec-type`, `--spec-draft-model`/-md,
  `--spec-draft-n-max`), common/speculative.cpp ("draft-mtp") and docs/speculative.md, in the
  tree vendored by llama-cpp-python 0.3.36 (tools/server/README.md lists `--spec-type
  none,draft-simple,...,draft-mtp,...`); an mtp-*.gguf sidecar is the draft model (-md)
  that `-hf` discovers beside the target (common/download.cpp find_best_mtp), and an
  assistant GGUF given on its own is the same -md with draft-mtp, never draft-simple.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_export import flags, pair

from localspec.cli.main import main
from localspec.models.entries import HubArtifact, Pair
from localspec.models.export import ExportError, export_pair
from localspec.models.registry import load_registry

VLLM_MTP_CONFIG = {"method": "mtp", "num_speculative_tokens": 3}
SGLANG_MTP_FLAGS = {
    "--speculative-algorithm": "EAGLE",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
}
LLAMA_SERVER_MTP_FLAGS = {
    "--spec-type": "draft-mtp",
    "--spec-draft-n-max": "3",
    "--spec-draft-n-min": "0",
    "--spec-draft-p-min": "0.0",
}


def pulled(p: Pair) -> tuple[Path, Path | None]:
    """Where a pull puts a target: one snapshot folder of the hub cache per repo commit."""
    artifact = p.target.artifacts["llamacpp"]
    assert isinstance(artifact, HubArtifact)
    name = artifact.files[0].name
    return Path(f"/cache/models--x/snapshots/abc/{name}"), None


def test_vllm_gets_the_mtp_method_and_no_draft_model() -> None:
    out = export_pair(pair("qwen3.6-27b"), "vllm")
    assert out.argv[:3] == ("vllm", "serve", "Qwen/Qwen3.6-27B")
    assert json.loads(flags(out.argv)["--speculative-config"]) == VLLM_MTP_CONFIG


def test_sglang_runs_the_mtp_layers_as_eagle_without_a_draft_model_path() -> None:
    given = flags(export_pair(pair("qwen3.5-9b"), "sglang").argv)
    assert given["--model-path"] == "Qwen/Qwen3.5-9B"
    assert {k: given[k] for k in SGLANG_MTP_FLAGS} == SGLANG_MTP_FLAGS
    assert "--speculative-draft-model-path" not in given


def test_llama_server_drafts_with_the_targets_own_head() -> None:
    out = export_pair(pair("qwen3.6-35b-a3b"), "llama-server", ggufs=pulled)
    given = flags(out.argv)
    assert given["-m"] == "/cache/models--x/snapshots/abc/Qwen3.6-35B-A3B-UD-Q4_K_M.gguf"
    assert "-md" not in given
    assert {k: given[k] for k in LLAMA_SERVER_MTP_FLAGS} == LLAMA_SERVER_MTP_FLAGS


def test_llama_server_gets_the_gemma_assistant_sidecar_from_beside_the_target() -> None:
    out = export_pair(pair("gemma-4-31b"), "llama-server", ggufs=pulled)
    given = flags(out.argv)
    assert given["-m"] == "/cache/models--x/snapshots/abc/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf"
    assert given["-md"] == "/cache/models--x/snapshots/abc/mtp-gemma-4-31B-it.gguf"
    assert given["--spec-type"] == "draft-mtp"


@pytest.mark.parametrize(
    ("name", "target", "assistant"),
    [
        ("gemma-4-12b", "google/gemma-4-12B-it", "google/gemma-4-12B-it-assistant"),  # the sidecar's checkpoint
        ("gemma-4-31b", "google/gemma-4-31B-it", "google/gemma-4-31B-it-assistant"),
        ("gemma-4-e4b-assistant", "google/gemma-4-E4B-it", "google/gemma-4-E4B-it-assistant"),  # the drafter's
    ],
)
def test_vllm_takes_the_gemma_assistant_as_the_mtp_methods_model(name: str, target: str, assistant: str) -> None:
    out = export_pair(pair(name), "vllm")
    assert out.argv[:3] == ("vllm", "serve", target)
    config = json.loads(flags(out.argv)["--speculative-config"])
    assert config == {"method": "mtp", "model": assistant, "num_speculative_tokens": 3}


def test_sglang_takes_the_gemma_assistant_as_the_draft_model_of_nextn() -> None:
    given = flags(export_pair(pair("gemma-4-12b"), "sglang").argv)
    assert given["--speculative-algorithm"] == "NEXTN"  # promoted by SGLang to FROZEN_KV_MTP
    assert given["--speculative-draft-model-path"] == "google/gemma-4-12B-it-assistant"
    steps = int(given["--speculative-num-steps"])
    assert (given["--speculative-eagle-topk"], int(given["--speculative-num-draft-tokens"])) == ("1", steps + 1)


def test_an_added_gemma4_pair_exports_its_assistant_as_draft_mtp(tmp_path: Path) -> None:
    from localspec.models.local_pairs import add_local_pair
    from localspec.models.registry import user_registry_file
    from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair

    target, assistant = write_gemma4_pair(Gemma4Spec(), tmp_path)
    added = add_local_pair("gem", target, assistant)
    given = flags(export_pair(added, "llama-server").argv)
    assert (given["-m"], given["-md"]) == (str(target), str(assistant))
    assert {k: given[k] for k in LLAMA_SERVER_MTP_FLAGS} == LLAMA_SERVER_MTP_FLAGS
    # An entry written before `add` knew assistants (strategy draft) exports the same way.
    user_registry_file().write_text(user_registry_file().read_text().replace('strategy = "mtp"', 'strategy = "draft"'))
    old = load_registry().pair("gem")
    assert old.strategy == "draft"
    assert flags(export_pair(old, "llama-server").argv)["--spec-type"] == "draft-mtp"


def test_an_mtp_draft_length_is_fixed_at_3_with_a_note_unless_given() -> None:
    auto = export_pair(pair("qwen3.6-27b"), "llama-server", ggufs=pulled)
    assert any("takes a fixed one: 3" in note for note in auto.notes)
    given = export_pair(pair("qwen3.6-27b"), "llama-server", draft_tokens=1, ggufs=pulled)
    assert flags(given.argv)["--spec-draft-n-max"] == "1" and not given.notes


def test_an_mtp_pair_can_still_be_exported_as_ngram() -> None:
    config = json.loads(flags(export_pair(pair("qwen3.6-27b"), "vllm", strategy="ngram").argv)["--speculative-config"])
    assert config["method"] == "ngram"


def test_mtp_for_a_pair_without_an_mtp_drafter_is_refused_with_what_works() -> None:
    with pytest.raises(ExportError, match="no MTP drafter") as caught:
        export_pair(pair("qwen3-8b"), "vllm", strategy="mtp")
    assert caught.value.hint == "export it with --strategy ngram or draft"


def test_the_cli_takes_strategy_mtp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "qwen3.6", "--to", "vllm", "--strategy", "mtp", "--draft-tokens", "2"]) == 0
    assert '{"method": "mtp", "num_speculative_tokens": 2}' in capsys.readouterr().out
