"""A hub that accepts the connection and never answers, or stops mid-file, ends a pull within
the timeouts the user set (HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT), with a waiting line
while it waits and an error that says what to do (issue 33); so does one that trickles a byte
at a time, under the floor of localspec.models.hub_floor (issue 47)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.models.hub_errors import PullError
from localspec.models.pull import pull, resolve_pair
from localspec.testing.fakehub import TEST_REGISTRY, FakeHub, serve_test_pairs, trickling_endpoint

SHORT_TIMEOUT = "1"  # seconds, for both hub timeouts: the tests wait a few of them at most
CHILD_BOUND_SECONDS = 90  # a bound, not a timing: the pull ends after a few timeouts


@pytest.fixture
def silent_hub() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that accepts every connection and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)  # kept open, unanswered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    done.set()
    server.close()
    for conn in held:
        conn.close()


@pytest.fixture
def short_timeouts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, temporary_localspec_home: Path) -> None:
    """Both hub timeouts short, a private hub cache, and the test pairs in the registry."""
    temporary_localspec_home.mkdir(parents=True, exist_ok=True)
    (temporary_localspec_home / "models.toml").write_text(TEST_REGISTRY)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", SHORT_TIMEOUT)
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", SHORT_TIMEOUT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.mark.usefixtures("short_timeouts")
def test_pull_from_a_hub_that_never_answers_ends_saying_what_to_do(silent_hub: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "localspec", "pull", "tiny", "--endpoint", silent_hub],
        capture_output=True,
        text=True,
        timeout=CHILD_BOUND_SECONDS,
        env=os.environ.copy(),
    )
    assert done.returncode == 2, done.stderr
    assert f"localspec: waiting for {silent_hub} (asking about test/tiny-drafter-GGUF)" in done.stderr
    assert f"error: {silent_hub} stopped answering about test/tiny-drafter-GGUF (no reply within 1 s)" in done.stderr
    assert "HF_HUB_ETAG_TIMEOUT" in done.stderr.splitlines()[-1] and "Traceback" not in done.stderr


@pytest.mark.usefixtures("short_timeouts")
def test_an_app_is_told_the_hub_is_slow_through_its_progress_callback(silent_hub: str) -> None:
    seen: list[str] = []
    with pytest.raises(PullError, match="stopped answering"):
        pull("tiny", endpoint=silent_hub, on_progress=lambda done, total, what: seen.append(what))
    assert any(what.startswith(f"waiting for {silent_hub}") for what in seen)


@pytest.mark.usefixtures("short_timeouts")
def test_a_file_that_stalls_mid_transfer_is_fetched_again_after_the_download_timeout(
    temporary_localspec_home: Path,
) -> None:
    with FakeHub() as hub:
        serve_test_pairs(hub, temporary_localspec_home)
        hub.stall_after("tiny-drafter.gguf", 1000)  # the first GET sends 1000 bytes, then nothing
        started = time.monotonic()
        pull("tiny", endpoint=hub.endpoint, progress=False)
        waited = time.monotonic() - started
    resolved = resolve_pair("tiny")
    assert resolved.drafter is not None
    assert resolved.drafter.read_bytes() == hub.repos["test/tiny-drafter-GGUF"].files["tiny-drafter.gguf"]
    assert hub.resolve_gets().count("tiny-drafter.gguf") == 2
    # huggingface-hub's own default is 10 s: well under it, the timeout set now was used
    assert waited < 8, waited


TRICKLE_INTERVAL = 0.2  # seconds between two bytes: 5 bytes/s, far under the floor


def pull_in_child(endpoint: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", "pull", "tiny", "--endpoint", endpoint],
        capture_output=True,
        text=True,
        timeout=CHILD_BOUND_SECONDS,
        env=os.environ.copy(),
    )


@pytest.mark.usefixtures("short_timeouts")
def test_a_hub_that_trickles_its_answers_ends_the_pull_like_a_silent_one() -> None:
    with trickling_endpoint(TRICKLE_INTERVAL) as hub:
        done = pull_in_child(hub)
    assert done.returncode == 2, done.stderr
    assert f"error: {hub} stopped answering about test/tiny-drafter-GGUF (a trickle: " in done.stderr
    assert "under 1 kB/s" in done.stderr and "HF_HUB_ETAG_TIMEOUT" in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr


@pytest.mark.usefixtures("short_timeouts")
def test_a_file_sent_a_byte_at_a_time_ends_the_pull_and_keeps_nothing_partial(
    temporary_localspec_home: Path, tmp_path: Path
) -> None:
    with FakeHub() as hub:
        serve_test_pairs(hub, temporary_localspec_home)
        hub.trickle("tiny-drafter.gguf", TRICKLE_INTERVAL)
        with pytest.raises(PullError) as caught:
            pull("tiny", endpoint=hub.endpoint, progress=False)
    assert "stopped answering while sending tiny-drafter.gguf" in caught.value.message
    assert "a trickle:" in caught.value.message and "nothing partial was kept" in caught.value.message
    assert not list((tmp_path / "hub-cache").rglob("*.incomplete"))
    assert hub.resolve_gets().count("tiny-drafter.gguf") == 1  # not resumed again and again


@pytest.mark.usefixtures("short_timeouts")
def test_a_trickled_file_in_the_cli_ends_with_what_to_do(temporary_localspec_home: Path) -> None:
    with FakeHub() as hub:
        serve_test_pairs(hub, temporary_localspec_home)
        hub.trickle("tiny-drafter.gguf", TRICKLE_INTERVAL)
        done = pull_in_child(hub.endpoint)
    assert done.returncode == 2, done.stderr
    assert "stopped answering while sending tiny-drafter.gguf" in done.stderr and "Traceback" not in done.stderr


class SlowStream:
    """A network stream that hands out one byte per read, as a trickling hub's would."""

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return b"x"

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        pass


def test_the_floor_applies_only_inside_a_pull() -> None:
    from localspec.models.hub_floor import HubTooSlowError, _FlooredStream, throughput_floor

    stream = _FlooredStream(SlowStream())
    stream.write(b"GET / HTTP/1.1\r\n\r\n", 1.0)
    assert stream.read(1, timeout=0.0) == b"x"  # outside a pull: reads as huggingface-hub's own would
    with throughput_floor():
        stream.read(1, timeout=60.0)  # a byte within the stretch
        with pytest.raises(HubTooSlowError, match="under the floor"):
            stream.read(1, timeout=0.0)  # the stretch is over and brought 1 byte: under the floor
