"""`localspec export` of a DSpark pair: llama.cpp's own spelling, and a refusal where an engine
documents none.

- llama-server: llama.cpp docs/speculative.md ("DSpark (`draft-dspark`)") and common/arg.cpp in
  the tree vendored by llama-cpp-python 0.3.36: `llama-server -m TARGET.gguf -md DRAFTER.gguf
  --spec-type draft-dspark --spec-draft-n-max N`, N clamped to the drafter's trained block.
- vLLM and SGLang: neither's documentation names a DSpark method (vLLM's speculative decoding
  methods list and SGLang's speculative algorithms, checked 2026-11-29; the speculators library
  trains DSpark drafters, which no released vLLM serves), so both are refused with what to use.

models.toml has no DSpark pair (no GGUF conversion of a DSpark drafter is named anywhere this
project can check), so the pair here is the DFlash pair's target with a DSpark drafter file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_export import flags, pair

from localspec.models.entries import Pair
from localspec.models.export import FIXED_DSPARK_DRAFT_TOKENS, ExportError, export_pair


def dspark_pair() -> Pair:
    return replace(pair("qwen3.6-27b-dflash"), id="qwen3.6-27b-dspark", strategy="dspark")


def pulled(p: Pair) -> tuple[Path, Path | None]:
    return Path("/models/target.gguf"), Path("/models/dspark.gguf")


def test_llama_server_gets_draft_dspark_with_the_pulled_drafter() -> None:
    export = export_pair(dspark_pair(), "llama-server", ggufs=pulled)
    given = flags(export.argv)
    assert given["-m"] == "/models/target.gguf" and given["-md"] == "/models/dspark.gguf"
    assert given["--spec-type"] == "draft-dspark"
    assert given["--spec-draft-n-max"] == str(FIXED_DSPARK_DRAFT_TOKENS)
    assert given["--spec-draft-p-min"] == "0.0"  # llama.cpp reads a confidence head only above 0
    given = flags(export_pair(dspark_pair(), "llama-server", draft_tokens=7, ggufs=pulled).argv)
    assert given["--spec-draft-n-max"] == "7"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engine_that_documents_no_dspark_is_refused_with_what_to_use(engine: str) -> None:
    with pytest.raises(ExportError, match="documents no DSpark method") as refused:
        export_pair(dspark_pair(), engine)
    assert "--to llama-server" in (refused.value.hint or "")


def test_dspark_for_a_pair_without_a_dspark_drafter_is_refused() -> None:
    with pytest.raises(ExportError, match="no DSpark drafter"):
        export_pair(pair("qwen3.6-27b-dflash"), "llama-server", strategy="dspark", ggufs=pulled)
