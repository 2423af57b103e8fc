"""A model path that is not a regular file is refused before it is opened (issue 33): a named
pipe blocks an open until a writer comes, and a device never ends. Each CLI case runs in a
child with a bound, so a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.common.gguf_header import check_gguf, read_header
from localspec.core.errors import ModelLoadError

HANG_BOUND_SECONDS = 120  # a bound, not a timing: the refusal comes before any model loads

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.gguf"
    os.mkfifo(path)
    return path


def localspec_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args],
        capture_output=True,
        text=True,
        timeout=HANG_BOUND_SECONDS,
    )


@needs_fifo
def test_the_header_check_refuses_a_named_pipe_naming_what_it_is(fifo: Path) -> None:
    with pytest.raises(ModelLoadError) as caught:
        check_gguf(str(fifo))
    assert "is a named pipe" in caught.value.message and str(fifo) in caught.value.message
    assert caught.value.hint and "regular file" in caught.value.hint


@needs_fifo
def test_the_header_reader_refuses_a_named_pipe(fifo: Path) -> None:
    with pytest.raises(ModelLoadError, match="named pipe"):
        read_header(fifo)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_before_it_is_read() -> None:
    with pytest.raises(ModelLoadError, match="character device"):
        read_header("/dev/zero")


def test_a_symlink_to_a_gguf_is_read(tmp_path: Path) -> None:
    from localspec.testing.gguf_writer import Spec, write_gguf

    model = write_gguf(Spec("llama"), tmp_path / "tiny.gguf")
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    check_gguf(str(link))
    assert read_header(link).tensors


@needs_fifo
@pytest.mark.usefixtures("smollm2_q4_1")  # the CLI needs llama-cpp-python to reach the check
def test_run_with_a_named_pipe_as_model_ends_with_a_clear_error(fifo: Path) -> None:
    done = localspec_cli("run", "-m", str(fifo), "hello")
    assert done.returncode == 2, done.stderr
    assert "is a named pipe" in done.stderr and "Traceback" not in done.stderr


@needs_fifo
@pytest.mark.model
def test_run_with_a_named_pipe_as_draft_model_ends_with_a_clear_error(smollm2_q4_1: Path, fifo: Path) -> None:
    done = localspec_cli("run", "-m", str(smollm2_q4_1), "--draft-model", str(fifo), "hello")
    assert done.returncode == 2, done.stderr
    assert "is a named pipe" in done.stderr and "Traceback" not in done.stderr
