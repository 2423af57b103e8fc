"""User data is written whole or not at all (issue 33): a full disk leaves the old file and
says how much to free, a read-only data folder costs a cache one notice and a record a clear
error, never a traceback. Tests run as root, where chmod does not stop writes, so the disk's
answers (ENOSPC, EROFS) are injected into localspec.store's own write and open."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import localspec.store as store
from localspec.cli.main import main
from localspec.models.registry import load_registry, user_registry_file
from localspec.store import StoreError, write_atomic, write_json_atomic
from localspec.testing.fakehub import TEST_REGISTRY, TOKENS, FakeHub, serve_test_pairs, tiny_gguf

WRITE_ALL = store._write_all


def fail_writes(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Every write through localspec.store fails as a disk answering `code` would."""

    def write(fd: int, raw: bytes) -> None:
        os.write(fd, raw[: len(raw) // 2])  # part of it lands, as on a disk that fills mid-write
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(store, "_write_all", write)


def read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No file can be created in any folder (a read-only mount)."""

    def refuse(path: Path) -> tuple[int, Path]:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path.parent))

    monkeypatch.setattr(store, "_temporary", refuse)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- the helper -------------------------------------------------------------------------------


def test_a_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"b": 2})
    assert json.loads(path.read_text()) == {"b": 2}
    assert leftovers(tmp_path) == []


def test_a_full_disk_leaves_the_old_file_and_says_how_much_to_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "data.json"
    path.write_text("old")
    fail_writes(monkeypatch, errno.ENOSPC)
    with pytest.raises(StoreError) as caught:
        write_atomic(path, "x" * 3_500_000)
    assert caught.value.message.startswith(f"disk full: free 4 MB in {tmp_path} to save data.json")
    assert caught.value.hint and "localspec rm" in caught.value.hint
    assert path.read_text() == "old" and leftovers(tmp_path) == []


def test_a_refused_check_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("old")

    def refuse(written: Path) -> None:
        assert written.read_text() == "new" and written.parent == tmp_path
        raise ValueError("not what we meant")

    with pytest.raises(ValueError):
        write_atomic(path, "new", check=refuse)
    assert path.read_text() == "old" and leftovers(tmp_path) == []


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text("old")
    path.chmod(0o644)
    write_atomic(path, "new")
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_read_only_folder_is_named_with_the_variable_that_moves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_only(monkeypatch)
    with pytest.raises(StoreError) as caught:
        write_atomic(tmp_path / "x.json", "{}")
    assert caught.value.message.startswith(f"{tmp_path} is read-only here: x.json was not saved")
    assert caught.value.hint and "LOCALSPEC_HOME" in caught.value.hint


# -- models.toml --------------------------------------------------------------------------------


@pytest.fixture
def gguf_pair(tmp_path: Path) -> dict[str, Path]:
    out = {"target": tmp_path / "t.gguf", "drafter": tmp_path / "d.gguf"}
    out["target"].write_bytes(tiny_gguf(TOKENS))
    out["drafter"].write_bytes(tiny_gguf(TOKENS, padding=1 << 12))
    return out


def test_add_on_a_full_disk_leaves_models_toml_whole_and_says_disk_full(
    gguf_pair: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["add", "first", "--target", str(gguf_pair["target"])]) == 0
    before = user_registry_file().read_bytes()
    fail_writes(monkeypatch, errno.ENOSPC)
    argv = ["add", "second", "--target", str(gguf_pair["target"]), "--drafter", str(gguf_pair["drafter"])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"localspec: error: disk full: free 1 MB in {user_registry_file().parent}" in err
    assert "Traceback" not in err
    assert user_registry_file().read_bytes() == before
    monkeypatch.setattr(store, "_write_all", WRITE_ALL)  # the disk has room again
    assert main(["list"]) == 0  # the registry still reads
    assert "first" in load_registry().pairs and "second" not in load_registry().pairs


def test_add_in_a_read_only_data_folder_is_one_clear_error(
    gguf_pair: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    read_only(monkeypatch)
    assert main(["add", "mine", "--target", str(gguf_pair["target"])]) == 2
    err = capsys.readouterr().err
    assert "is read-only here: models.toml was not saved" in err and "Traceback" not in err
    assert not user_registry_file().exists()


# -- caches -------------------------------------------------------------------------------------


def test_a_cache_in_a_read_only_folder_costs_one_notice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec.store import CALIBRATION

    read_only(monkeypatch)
    CALIBRATION.put("a-key", {"seconds_per_token": 0.5})
    CALIBRATION.put("b-key", {"seconds_per_token": 0.5})
    err = capsys.readouterr().err
    assert err.count("localspec: note: the calibration (measured again next time) was not saved:") == 1
    assert "read-only" in err and "Traceback" not in err
    assert CALIBRATION.get("a-key") is None


def test_a_cache_on_a_full_disk_keeps_its_old_content(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec.store import CALIBRATION, calibration_file

    CALIBRATION.put("kept", {"seconds_per_token": 0.25})
    fail_writes(monkeypatch, errno.ENOSPC)
    CALIBRATION.put("lost", {"seconds_per_token": 0.5})
    assert "disk full: free 1 MB in" in capsys.readouterr().err
    monkeypatch.setattr(store, "_write_all", WRITE_ALL)
    assert CALIBRATION.get("kept") == {"seconds_per_token": 0.25} and CALIBRATION.get("lost") is None
    assert json.loads(calibration_file().read_text())  # whole JSON, not a cut one


def test_the_fingerprint_index_in_a_read_only_folder_still_gives_the_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec.store import file_fingerprint

    model = tmp_path / "m.gguf"
    model.write_bytes(tiny_gguf(TOKENS))
    read_only(monkeypatch)
    assert len(file_fingerprint(str(model))) == 64
    assert "was not saved" in capsys.readouterr().err


# -- pull records -------------------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temporary_localspec_home: Path) -> Iterator[FakeHub]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub() as fake:
        serve_test_pairs(fake, temporary_localspec_home)
        yield fake


def test_a_pull_that_cannot_record_itself_says_so_without_a_traceback(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], temporary_localspec_home: Path
) -> None:
    assert (temporary_localspec_home / "models.toml").read_text() == TEST_REGISTRY
    real = store._temporary

    def no_pulled_folder(path: Path) -> tuple[int, Path]:
        if "pulled" in path.parts:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(path)

    monkeypatch.setattr(store, "_temporary", no_pulled_folder)
    assert main(["pull", "tiny-solo", "-q", "--endpoint", hub.endpoint]) == 2
    err = capsys.readouterr().err
    assert "was fetched, but the record that it is pulled could not be saved" in err
    assert "nothing is downloaded again" in err and "Traceback" not in err


# -- a requantization that fails ------------------------------------------------------------------


def test_a_requantization_failure_is_explained_by_the_disk_it_did_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from localspec.backends.llamacpp.copies import quantize_failure_cause
    from localspec.common.gguf_header import quantized_bytes
    from localspec.testing.gguf_writer import Spec, write_gguf

    source = write_gguf(Spec("llama"), tmp_path / "tiny.gguf")
    assert 0 < quantized_bytes(str(source), "Q8_0") < quantized_bytes(str(source), "F16")
    assert quantize_failure_cause(str(source), str(tmp_path / "out" / "x.gguf"), "Q8_0") is None
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: shutil._ntuple_diskusage(10**9, 10**9, 0))  # type: ignore[attr-defined]
    cause = quantize_failure_cause(str(source), str(tmp_path / "out" / "x.gguf"), "Q8_0")
    assert cause is not None and cause.startswith(f"disk full: free 1 MB in {tmp_path}")
