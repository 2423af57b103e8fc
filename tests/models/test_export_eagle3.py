"""`localspec export --strategy eagle3`: each engine's own EAGLE-3 settings, spelled as its current
documentation spells them.

- vLLM: docs.vllm.ai features/speculative_decoding/eagle ("Eagle3 Drafter Example"):
  speculative_config {"model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
  "num_speculative_tokens": N, "method": "eagle3"}; vllm/config/speculative.py lists "eagle3"
  among EagleModelTypes. Red Hat's speculators docs (algorithms/eagle3) name
  RedHatAI/Qwen3-8B-speculator.eagle3 for Qwen/Qwen3-8B.
- SGLang: docs.sglang.io advanced_features/speculative_decoding ("Quick guidance": EAGLE-3 with
  `--speculative-algorithm EAGLE3`; `--speculative-draft-model-path` is required, with
  `--speculative-num-steps`, `--speculative-eagle-topk`, `--speculative-num-draft-tokens`).
- llama-server: llama.cpp docs/speculative.md ("EAGLE-3 (`draft-eagle3`)": `llama-server -m
  TARGET.gguf -md HEAD-eagle3.gguf --spec-type draft-eagle3`), common/arg.cpp and
  common/speculative.cpp in the tree vendored by llama-cpp-python 0.3.36; a head beside its
  target in a repo is named eagle3-*.gguf (common/download.cpp find_best_eagle3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_export_mtp import flags, pair, pulled

from localspec.cli.main import main
from localspec.models.export import ExportError, export_pair

VLLM_EAGLE3 = {"method": "eagle3", "model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"}
SGLANG_EAGLE3_FLAGS = {
    "--speculative-algorithm": "EAGLE3",
    "--speculative-draft-model-path": "RedHatAI/Qwen3-8B-speculator.eagle3",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
}
LLAMA_SERVER_EAGLE3_FLAGS = {
    "--spec-type": "draft-eagle3",
    "--spec-draft-n-max": "3",
    "--spec-draft-n-min": "0",
    "--spec-draft-p-min": "0.0",
}


def test_vllm_gets_the_eagle3_method_with_the_heads_checkpoint() -> None:
    out = export_pair(pair("llama-3.1-8b"), "vllm", strategy="eagle3")
    assert out.argv[:3] == ("vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct")
    assert json.loads(flags(out.argv)["--speculative-config"]) == {**VLLM_EAGLE3, "num_speculative_tokens": 3}


def test_sglang_gets_eagle3_with_the_head_as_its_draft_model_path() -> None:
    given = flags(export_pair(pair("qwen3-8b"), "sglang", strategy="eagle3").argv)
    assert given["--model-path"] == "Qwen/Qwen3-8B"
    assert {k: given[k] for k in SGLANG_EAGLE3_FLAGS} == SGLANG_EAGLE3_FLAGS


def test_llama_server_gets_draft_eagle3_and_how_to_convert_the_head() -> None:
    out = export_pair(pair("qwen3-8b"), "llama-server", strategy="eagle3", ggufs=pulled)
    given = flags(out.argv)
    assert given["-m"] == "/cache/models--x/snapshots/abc/Qwen3-8B-Q4_K_M.gguf"
    assert given["-md"] == "/cache/models--x/snapshots/abc/eagle3-Qwen3-8B-Q4_K_M.gguf"
    assert {k: given[k] for k in LLAMA_SERVER_EAGLE3_FLAGS} == LLAMA_SERVER_EAGLE3_FLAGS
    assert any("convert_hf_to_gguf.py RedHatAI/Qwen3-8B-speculator.eagle3 --target-model-dir" in n for n in out.notes)


def test_a_pair_without_a_head_is_refused_with_what_to_export_instead() -> None:
    with pytest.raises(ExportError, match="no EAGLE-3 head") as refused:
        export_pair(pair("smollm2-1.7b"), "vllm", strategy="eagle3")
    assert refused.value.hint is not None and "--strategy ngram or draft" in refused.value.hint


def test_the_cli_takes_strategy_eagle3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["export", "llama-3.1-8b", "--to", "vllm", "--strategy", "eagle3", "--draft-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert '"method": "eagle3"' in out and '"num_speculative_tokens": 2' in out


def test_an_added_pair_with_an_eagle3_head_exports_as_draft_eagle3(tmp_path: Path) -> None:
    from localspec.models.local_pairs import add_local_pair
    from localspec.models.registry import load_registry, user_registry_file
    from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
    from localspec.testing.gguf_writer import Spec, write_gguf

    spec = Spec("llama")
    target = write_gguf(spec, tmp_path / "target.gguf")
    head = write_eagle3_gguf(spec, HeadSpec(), tmp_path / "eagle3-target.gguf")
    added = add_local_pair("e3", target, head)
    assert added.strategy == "eagle3"
    given = flags(export_pair(added, "llama-server").argv)
    assert (given["-m"], given["-md"]) == (str(target), str(head))
    assert {k: given[k] for k in LLAMA_SERVER_EAGLE3_FLAGS} == LLAMA_SERVER_EAGLE3_FLAGS
    # An entry written before `add` knew EAGLE-3 heads (strategy draft) exports the same way.
    user_registry_file().write_text(
        user_registry_file().read_text().replace('strategy = "eagle3"', 'strategy = "draft"')
    )
    assert flags(export_pair(load_registry().pair("e3"), "llama-server").argv)["--spec-type"] == "draft-eagle3"
