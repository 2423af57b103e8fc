"""`localspec export` of a DFlash pair: each engine's own DFlash settings, spelled as its
current documentation spells them.

- vLLM: its speculators guide (docs.vllm.ai projects/speculators, algorithms/dflash) and
  z-lab's dflash README: `vllm serve TARGET --speculative-config '{"method": "dflash",
  "model": "z-lab/<target>-DFlash", "num_speculative_tokens": 15}'`.
- SGLang: z-lab's dflash README ("Serving with SGLang"): `python -m sglang.launch_server
  --model-path TARGET --speculative-algorithm DFLASH --speculative-draft-model-path
  z-lab/<target>-DFlash`; the block size comes from the drafter's config.
- llama-server: llama.cpp docs/speculative.md ("DFlash (`draft-dflash`)") and common/arg.cpp
  in the tree vendored by llama-cpp-python 0.3.36: `llama-server -m TARGET.gguf -md
  DRAFTER.gguf --spec-type draft-dflash --spec-draft-n-max 15`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_export import flags, pair

from localspec.cli.main import main
from localspec.models.entries import HubArtifact, Pair
from localspec.models.export import ExportError, export_pair

PAIRS = {"qwen3.6-27b-dflash": "z-lab/Qwen3.6-27B-DFlash", "gemma-4-31b-dflash": "z-lab/gemma-4-31B-it-DFlash"}


def pulled(p: Pair) -> tuple[Path, Path | None]:
    return Path("/models/target.gguf"), Path("/models/drafter.gguf")


@pytest.mark.parametrize("name", PAIRS)
def test_the_registry_pairs_the_target_with_its_dflash_drafter_on_llamacpp(name: str) -> None:
    p = pair(name)
    assert p.strategy == "dflash" and p.drafter is not None and p.backends == ("llamacpp",)
    assert p.drafter.family == p.target.family
    gguf = p.drafter.artifacts["llamacpp"]
    assert isinstance(gguf, HubArtifact) and gguf.revision == "main"  # unpinned until checked against the hub


@pytest.mark.parametrize(("name", "drafter"), PAIRS.items())
def test_vllm_gets_its_dflash_method_with_the_z_lab_drafter(name: str, drafter: str) -> None:
    argv = export_pair(pair(name), "vllm").argv
    config = json.loads(flags(argv)["--speculative-config"])
    assert config == {"method": "dflash", "model": drafter, "num_speculative_tokens": 15}


@pytest.mark.parametrize(("name", "drafter"), PAIRS.items())
def test_sglang_gets_its_dflash_algorithm(name: str, drafter: str) -> None:
    export = export_pair(pair(name), "sglang")
    given = flags(export.argv)
    assert given["--speculative-algorithm"] == "DFLASH"
    assert given["--speculative-draft-model-path"] == drafter
    assert "--speculative-num-draft-tokens" not in given
    assert any("whole trained block" in note for note in export.notes)


def test_llama_server_gets_draft_dflash_with_the_pulled_drafter() -> None:
    argv = export_pair(pair("qwen3.6-27b-dflash"), "llama-server", ggufs=pulled).argv
    given = flags(argv)
    assert given["-m"] == "/models/target.gguf" and given["-md"] == "/models/drafter.gguf"
    assert given["--spec-type"] == "draft-dflash" and given["--spec-draft-n-max"] == "15"
    given = flags(export_pair(pair("qwen3.6-27b-dflash"), "llama-server", draft_tokens=6, ggufs=pulled).argv)
    assert given["--spec-draft-n-max"] == "6"


def test_a_dflash_pair_on_a_target_with_an_assistant_keeps_dflash() -> None:
    """Gemma 4 31B ships an MTP assistant beside its GGUF; its DFlash pair still exports DFlash."""
    p = pair("gemma-4-31b-dflash")
    assert p.mtp == "later"
    assert flags(export_pair(p, "llama-server", ggufs=pulled).argv)["--spec-type"] == "draft-dflash"


def test_dflash_for_a_pair_without_a_dflash_drafter_is_refused(capsys) -> None:
    with pytest.raises(ExportError, match="no DFlash drafter"):
        export_pair(pair("gemma-4-31b"), "vllm", strategy="dflash")
    assert main(["export", "gemma-4-31b", "--to", "vllm", "--strategy", "dflash"]) != 0
    err = capsys.readouterr().err
    assert "no DFlash drafter" in err and "Traceback" not in err
