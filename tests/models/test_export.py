"""`localspec export`: the generated commands use only each engine's documented names.

The names are kept here with where they are documented, so a renamed flag shows up as a
failing test when this list is brought up to date, not as a command that fails for a user.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from localspec.cli.main import main
from localspec.models.entries import Pair
from localspec.models.export import ExportError, export_pair
from localspec.models.registry import load_registry

# vLLM, docs.vllm.ai "Speculative Decoding" (features/speculative_decoding: draft_model.md,
# n_gram.md) and vllm/config/speculative.py (SpeculativeConfig): `vllm serve MODEL
# --speculative-config JSON`.
VLLM_SPECULATIVE_CONFIG_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
VLLM_METHODS = {"draft_model", "ngram"}
VLLM_FLAGS = {"--host", "--port", "--speculative-config"}

# SGLang, docs.sglang.io advanced_features/speculative_decoding ("Standalone Speculative
# Decoding (Small Draft Model)", "Ngram Speculative Decoding", "Full Parameter Reference").
SGLANG_FLAGS = {
    "--model-path",
    "--host",
    "--port",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
}
SGLANG_ALGORITHMS = {"STANDALONE", "NGRAM"}

# llama-server, llama.cpp common/arg.cpp and tools/server/README.md after the 2026 renames
# (--draft-max/--draft-min became --spec-draft-n-max/-n-min), as `--help` of the programs
# built from llama-cpp-python 0.3.36's vendored source lists them (spec types included).
LLAMA_SERVER_FLAGS = {
    "-m",
    "-md",
    "--host",
    "--port",
    "--spec-type",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "--spec-draft-p-min",
    "--spec-ngram-simple-size-n",
    "--spec-ngram-simple-size-m",
}
LLAMA_SERVER_SPEC_TYPES = {"draft-simple", "ngram-simple"}


def pair(name: str) -> Pair:
    return load_registry().pair(name)


def flags(argv: tuple[str, ...]) -> dict[str, str]:
    """Each flag with the value after it ('' for a switch)."""
    out = {}
    for i, arg in enumerate(argv):
        if arg.startswith("-"):
            out[arg] = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else ""
    return out


def fake_ggufs(p: Pair) -> tuple[Path, Path | None]:
    return Path(f"/models/{p.target.id}.gguf"), Path(f"/models/{p.drafter.id}.gguf") if p.drafter else None


def test_vllm_draft_model_config_uses_documented_keys() -> None:
    out = export_pair(pair("smollm2-1.7b"), "vllm")
    assert out.argv[:3] == ("vllm", "serve", "HuggingFaceTB/SmolLM2-1.7B-Instruct")
    given = flags(out.argv)
    assert set(given) <= VLLM_FLAGS
    config = json.loads(given["--speculative-config"])
    assert set(config) <= VLLM_SPECULATIVE_CONFIG_KEYS
    drafter = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config == {"method": "draft_model", "model": drafter, "num_speculative_tokens": 4}


def test_vllm_ngram_config_uses_documented_keys() -> None:
    config = json.loads(flags(export_pair(pair("smollm2-135m"), "vllm").argv)["--speculative-config"])
    assert set(config) == {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
    assert config["method"] in VLLM_METHODS and config["method"] == "ngram"
    assert config["prompt_lookup_min"] <= config["prompt_lookup_max"]


def test_sglang_standalone_uses_documented_flags() -> None:
    out = export_pair(pair("smollm2-1.7b"), "sglang", draft_tokens=5)
    given = flags(out.argv)
    assert set(given) - {"-m"} <= SGLANG_FLAGS
    assert given["--speculative-algorithm"] == "STANDALONE"
    assert given["--speculative-draft-model-path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (given["--speculative-num-steps"], given["--speculative-num-draft-tokens"]) == ("5", "6")


def test_sglang_ngram_notes_that_it_needs_cuda() -> None:
    out = export_pair(pair("smollm2-135m"), "sglang")
    assert flags(out.argv)["--speculative-algorithm"] in SGLANG_ALGORITHMS
    assert any("CUDA" in note for note in out.notes)


def test_llama_server_loads_the_pulled_ggufs_with_current_spec_flags() -> None:
    out = export_pair(pair("qwen2.5-7b"), "llama-server", ggufs=fake_ggufs)
    given = flags(out.argv)
    assert set(given) <= LLAMA_SERVER_FLAGS
    assert given["-m"] == "/models/qwen2.5-7b-instruct.gguf" and given["-md"] == "/models/qwen2.5-0.5b-instruct.gguf"
    assert given["--spec-type"] in LLAMA_SERVER_SPEC_TYPES
    assert given["--spec-draft-n-max"] == "4"  # the pair's draft length is auto: fixed at 4, with a note
    assert not any("refuses" in note for note in out.notes)  # llama.cpp's pair check allows padding differences


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_strict_engines_are_said_to_refuse_qwen_7b_with_0_5b(engine: str) -> None:
    out = export_pair(pair("qwen2.5-7b"), engine)
    assert any("refuses" in note and "152064" in note and "151936" in note for note in out.notes)


def test_every_export_binds_to_this_machine_only() -> None:
    for engine in ("vllm", "sglang", "llama-server"):
        assert flags(export_pair(pair("smollm2-135m"), engine, ggufs=fake_ggufs).argv)["--host"] == "127.0.0.1"


def test_an_auto_draft_length_is_fixed_with_a_note() -> None:
    out = export_pair(pair("smollm2-135m"), "llama-server", ggufs=fake_ggufs)
    given = flags(out.argv)
    assert set(given) <= LLAMA_SERVER_FLAGS
    assert (given["--spec-type"], given["--spec-ngram-simple-size-m"]) == ("ngram-simple", "4")
    assert any("fixed" in note for note in out.notes)


def test_a_draft_export_of_a_pair_without_drafter_is_refused() -> None:
    with pytest.raises(ExportError, match="no drafter"):
        export_pair(pair("smollm2-135m"), "vllm", strategy="draft")


def test_the_script_is_one_shell_command_with_comments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "qwen2.5-7b", "--to", "vllm"]) == 0
    script = capsys.readouterr().out
    comments = [line for line in script.splitlines() if line.startswith("#")]
    command = shlex.split(script.replace("\\\n", " "), comments=True)
    assert comments and command[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]


def test_an_unpulled_pair_for_llama_server_names_the_pull_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "qwen2.5-7b", "--to", "llama-server"]) == 2
    assert "localspec pull qwen2.5-7b" in capsys.readouterr().err
