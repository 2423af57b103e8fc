"""Gemma 4's MTP assistant drafting on llama.cpp: a separate gemma4-assistant GGUF that reads
the target's KV cache and its last hidden state, so every guess goes to the target's next
position and nothing is ever taken out of a cache of its own. The tests write a tiny gemma4
target and its assistant (localspec/testing/gguf_writer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

import localspec
from localspec.api import runtime_for
from localspec.cli.main import main
from localspec.core.sampling import SamplingConfig
from localspec.testing.gguf_writer import Gemma4Spec, HybridSpec, write_gemma4_pair, write_qwen35_gguf

PROMPT = "the world and the world and the"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_gemma4_pair(Gemma4Spec(echo=True, seed=1, head_scale=8.0), tmp_path_factory.mktemp("gemma4"))


def test_the_assistant_drafts_for_its_target_and_greedy_output_stays_the_targets(pair) -> None:
    target, assistant = pair
    with localspec.load(model=str(target), n_ctx=256, strategy="none") as plain:
        expected = plain.generate(prompt=PROMPT, max_tokens=60, temperature=0)
    runtime = localspec.load(
        model=str(target), draft_model=str(assistant), n_ctx=256, strategy="draft", draft_tokens=3, calibrate=False
    )
    with runtime:
        assert runtime.label == "mtp" and runtime.draft is not None and runtime.draft.shared  # type: ignore[attr-defined]
        spec = runtime.generate(prompt=PROMPT, max_tokens=60, temperature=0)
    assert spec.tokens == expected.tokens
    assert spec.stats.drafted > spec.stats.accepted > 0


def test_the_cli_runs_a_gemma4_pair_at_the_default_draft_length(pair, capsys) -> None:
    target, assistant = pair
    code = main(["run", "--model", str(target), "--draft-model", str(assistant), "-t", "0", "-n", "20", PROMPT])
    err = capsys.readouterr().err
    assert code == 0, err


def test_assistant_sampling_follows_the_targets_law(pair) -> None:
    target, assistant = pair
    runtime = localspec.load(
        model=str(target), draft_model=str(assistant), n_ctx=256, strategy="draft", draft_tokens=2, calibrate=False
    )
    with runtime:
        start = runtime.prompt_tokens(PROMPT)
        plain = runtime_for(runtime.target, strategy="none")
        prompt = start + plain.generate(prompt=start, max_tokens=40, temperature=0).tokens
        law = exact_first_two(runtime.target, prompt, SamplingConfig(**SAMPLING))
        samples = sample_first_two(runtime, prompt, n=600)
    assert samples.cut_drafts > 0, "no draft was ever rejected: the residual path went untested"
    p = chi_square_p_value(samples.counts, law)
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_an_assistant_beside_another_model_is_refused_with_what_it_drafts_for(pair, tmp_path: Path, capsys) -> None:
    other = write_qwen35_gguf(HybridSpec(), tmp_path / "qwen35.gguf")
    code = main(["run", "-m", str(other), "--draft-model", str(pair[1]), "--max-tokens", "4", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "gemma4 model" in err and "Traceback" not in err


def test_the_assistant_file_alone_says_it_is_one_and_which_target_it_drafts_for(pair, tmp_path: Path, capsys) -> None:
    sidecar = tmp_path / "mtp-gemma-4-12B-it.gguf"  # as it is pulled beside its target
    sidecar.write_bytes(pair[1].read_bytes())
    code = main(["run", "-m", str(sidecar), "--max-tokens", "4", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and "context" not in err
    assert (
        "mtp-gemma-4-12B-it.gguf is a Gemma 4 MTP assistant, which drafts for the Gemma 4 model gemma-4-12B-it" in err
    )
    assert f"--model gemma-4-12B-it….gguf --draft-model {sidecar}" in err


def test_mtp_on_a_gemma4_target_without_its_assistant_points_to_draft_model(pair, capsys) -> None:
    code = main(["run", "-m", str(pair[0]), "--strategy", "mtp", "--max-tokens", "4", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "Gemma 4 drafts with its assistant" in err and "--draft-model" in err and "MTP-GGUF" not in err


def test_a_pulled_gemma_pair_drafts_with_the_assistant_pulled_beside_its_target(
    pair, tmp_path: Path, temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localspec.api import load_pair
    from localspec.models.pull import pull, resolve_pair
    from localspec.testing.fakehub import FakeHub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    target, assistant = pair
    files = {"gem-Q4_K_M.gguf": target.read_bytes(), "mtp-gem.gguf": assistant.read_bytes()}
    temporary_localspec_home.mkdir(parents=True, exist_ok=True)
    (temporary_localspec_home / "models.toml").write_text(
        '[models.gem]\nname = "Gem"\nfamily = "gemma4"\nlicense = "gemma"\nparams = "1M"\n'
        'llamacpp = { repo = "test/gem-GGUF", revision = "main", files = ["gem-Q4_K_M.gguf", "mtp-gem.gguf"] }\n'
        '[pairs.gem]\ndescription = "a tiny Gemma 4 with its assistant"\ntarget = "gem"\nstrategy = "mtp"\n'
    )
    with FakeHub() as hub:
        hub.add("test/gem-GGUF", files)
        pull("gem", endpoint=hub.endpoint, progress=False)
    resolved = resolve_pair("gem")
    assert resolved.drafter is not None and resolved.drafter.name == "mtp-gem.gguf"
    with load_pair("gem", n_ctx=256, calibrate=False, draft_tokens=3) as runtime:
        assert runtime.label == "mtp" and runtime.draft is not None
        spec = runtime.generate(prompt=PROMPT, max_tokens=30, temperature=0)
    with localspec.load(model=str(target), n_ctx=256, strategy="none") as plain:
        assert spec.tokens == plain.generate(prompt=PROMPT, max_tokens=30, temperature=0).tokens


# -- layerskip on the gemma4 target: a copy with blocks left out that describes the blocks it keeps


@pytest.mark.parametrize("strategy", ["layerskip:2", "layerskip:3", "layerskip"])
def test_layerskip_on_gemma4_drafts_and_greedy_output_stays_the_targets(pair, strategy: str) -> None:
    target = pair[0]
    with localspec.load(model=str(target), n_ctx=256, strategy="none") as plain:
        expected = plain.generate(prompt=PROMPT, max_tokens=30, temperature=0)
    with localspec.load(model=str(target), n_ctx=256, strategy=strategy, draft_tokens=3) as runtime:
        spec = runtime.generate(prompt=PROMPT, max_tokens=30, temperature=0)
    assert spec.tokens == expected.tokens
    assert spec.stats.drafted > 0


def test_a_derived_drafter_that_does_not_load_says_what_failed(pair, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from localspec.backends.llamacpp import copies

    monkeypatch.setattr(copies, "fit_pruned_blocks", lambda *args: None)  # llama.cpp's prune alone
    code = main(["run", "-m", str(pair[0]), "--strategy", "layerskip:2", "--max-tokens", "4", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "the layerskip:2 drafter derived from" in err
    assert "gemma4.attention.sliding_window_pattern has 4 entries for its 2 blocks" in err
    assert "download" not in err and "may not support" not in err
