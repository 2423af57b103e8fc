"""benchmarks/images.py runs in CI on the tiny vision pair: n-gram drafts on image prompts as
on text prompts, and the image's encode is timed apart from the target's prefill."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from repo_paths import ROOT


def _load_bench() -> ModuleType:
    path = ROOT / "benchmarks" / "images.py"
    spec = importlib.util.spec_from_file_location("images_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_images_benchmark_prints_both_sides_and_the_encode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "images.json"
    argv = ["images.py", "--answers", "2", "-n", "16", "--repeats", "2", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    _load_bench().main()
    printed = capsys.readouterr().out
    assert "text prompts" in printed and "image prompts" in printed and "plumbing figures" in printed
    figures = json.loads(out.read_text())
    assert figures["sides"]["image"]["tokens_per_pass"] > 1.0  # lookup drafted on image prompts, and was kept
    assert figures["sides"]["text"]["tokens_per_pass"] > 1.0
    assert figures["prefill"]["image_positions"] == 16
    assert figures["prefill"]["prefill_new_image_ms"] > 0 and figures["prefill"]["prefill_text_ms"] > 0
