"""llama.cpp's own speculative programs, built from the source vendored in the installed
llama-cpp-python's sdist and run on the same models, prompt and token count as localspec,
so `localspec bench --peers` compares like with like."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import httpx

from localspec.control.hardware import physical_cores
from localspec.core.errors import BackendUnavailableError
from localspec.store import data_dir

PROGRAMS = ("llama-speculative-simple", "llama-lookup")
RPC_SERVER = "ggml-rpc-server"  # llama.cpp's own RPC server, for a target split with --rpc
# llama.cpp's own plain-decoding benchmark: the figure localspec's plain decoding is held to.
LLAMA_BENCH = "llama-bench"
_SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")
# What a speculative peer printed it drafted and kept (llama-lookup, llama-speculative-simple).
_DRAFTED = re.compile(r"n_drafted\s+=\s+(\d+)")
_KEPT = re.compile(r"n_accept\s+=\s+(\d+)")


@dataclass(frozen=True)
class PeerResult:
    """tokens: its answer's, as localspec counts its own (see answer_tokens); tokens_per_s
    those over the seconds it printed."""

    program: str
    tokens: int
    seconds: float
    tokens_per_s: float
    acceptance_rate: float
    # What the program printed after the prompt (its answer, an end of text's token text
    # included); None where its output did not echo the prompt as given.
    text: str | None = None
    # The tokens it drafted and kept over the run, and those it decoded, end of text included,
    # as it printed them (0 where it did not).
    drafted: int = 0
    accepted: int = 0
    decoded: int = 0


def answer_after(stdout: str, prompt: str) -> str | None:
    """A llama.cpp example's answer: its output echoes the prompt's tokens, then prints each
    token it keeps."""
    at = stdout.find(prompt)
    return stdout[at + len(prompt) :] if at >= 0 else None


def same_answer(ours: str, theirs: str) -> bool:
    """Whether two greedy answers to one prompt are one text: one may stop earlier (a token
    limit counted otherwise) or go on with an end of text's token text."""
    a, b = ours.strip(), theirs.strip()
    return b.startswith(a) or a.startswith(b)


def peers_dir() -> Path:
    return data_dir() / "peers" / f"llama.cpp-{version('llama-cpp-python')}"


def find_or_build(bin_dir: str | Path | None = None, build: bool = False, programs: Sequence[str] = PROGRAMS) -> Path:
    """The folder holding llama.cpp's programs (the peers, or RPC_SERVER): given, already
    built, or built now (~10 min)."""
    folder = Path(bin_dir) if bin_dir else peers_dir() / "build" / "bin"
    if all((folder / p).exists() for p in programs):
        return folder
    if bin_dir or not build:
        raise BackendUnavailableError(
            f"llama.cpp's programs {', '.join(programs)} are not in {folder}",
            "add --build-peers to build them from llama-cpp-python's source (about 10 minutes on 2 cores)",
        )
    source = fetch_source(peers_dir())
    build_dir = peers_dir() / "build"
    flags = [
        "-DLLAMA_BUILD_EXAMPLES=ON",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_CURL=OFF",
        "-DGGML_RPC=ON",  # builds rpc-server, and lets the peers' own builds reach RPC servers
        "-DBUILD_SHARED_LIBS=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
    ]
    _run(["cmake", "-S", str(source), "-B", str(build_dir), *flags])
    _run(["cmake", "--build", str(build_dir), "-j", str(physical_cores()), "--target", *programs])
    return build_dir / "bin"


def fetch_source(dest: Path) -> Path:
    source = dest / "llama.cpp"
    if (source / "CMakeLists.txt").exists():
        return source
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pin = f"llama-cpp-python=={version('llama-cpp-python')}"
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp, pin])
        sdist = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix) :]
            tar.extractall(source, members=[m for m in members if m.name], filter="data")
    return source


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise BackendUnavailableError(f"building llama.cpp's programs failed: {' '.join(cmd[:3])}...\n{tail}")


@dataclass(frozen=True)
class PeerRun:
    """One greedy run of a peer program: prompt is the already-rendered chat text; extra_args:
    more of the program's own flags (llama-lookup's dynamic cache, say)."""

    program: str
    model: str
    prompt: str
    max_tokens: int
    draft_tokens: int
    draft_model: str | None = None
    threads: int | None = None
    extra_args: Sequence[str] = ()


def run_peer(bin_dir: Path, run: PeerRun) -> PeerResult:
    """Greedy run of one peer program from `bin_dir`."""
    program, prompt = run.program, run.prompt
    cmd = [
        str(bin_dir / program),
        "-m",
        run.model,
        "-p",
        prompt,
        "-n",
        str(run.max_tokens),
        "--temp",
        "0",
        "-t",
        str(run.threads or physical_cores()),
        "--spec-draft-n-max",
        str(run.draft_tokens),
        "-c",
        "4096",
    ]
    if run.draft_model:
        cmd += ["-md", run.draft_model, "--spec-type", "draft-simple"]
    cmd += run.extra_args
    env = peer_env(*command_models(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, env=env)
    output = result.stdout + result.stderr
    speed = _SPEED.search(output)
    if result.returncode != 0 or not speed:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise BackendUnavailableError(f"{program} failed (exit {result.returncode}):\n{tail}")
    accept = _ACCEPT.search(output)
    drafted, kept = _DRAFTED.search(output), _KEPT.search(output)
    tokens, seconds = answer_tokens(int(speed.group(1)), run.max_tokens), float(speed.group(2))
    return PeerResult(
        program,
        tokens,
        seconds,
        tokens / seconds if seconds > 0 else float(speed.group(3)),
        float(accept.group(1)) / 100 if accept else 0.0,
        answer_after(result.stdout, prompt),
        int(drafted.group(1)) if drafted else 0,
        int(kept.group(1)) if kept else 0,
        int(speed.group(1)),
    )


def answer_tokens(decoded: int, max_tokens: int) -> int:
    """The tokens of a peer's answer from the count it printed. llama.cpp's examples count the
    end of text's token as decoded, which is no part of the answer (localspec does not emit
    it, nor count it in its own rate): over the same passes, a 35-token answer read 3 % faster
    than localspec's same answer. They stop only once past n_predict, so a count within it
    ended on an end of text."""
    return decoded - 1 if 0 < decoded <= max_tokens else decoded


def _same_settings(models: Sequence[str]) -> dict[str, str]:
    """localspec's llama.cpp settings here (repacked weights, flash attention) for these model
    files as llama.cpp's own variables, so the peers run alike."""
    from localspec.core.backend_loader import backend_module

    llamacpp = backend_module("llamacpp")
    flash = {int(v): k for k, v in llamacpp.FLASH_ATTN.items()}[llamacpp.flash_attention()]
    return {"LLAMA_ARG_REPACK": "1" if llamacpp.buffers_for(*models) else "0", "LLAMA_ARG_FLASH_ATTN": flash}


def peer_env(*models: str) -> dict[str, str]:
    """The environment a llama.cpp program runs in beside localspec, given these model files:
    this one, with localspec's llama.cpp settings (on an AMX build whose AMX buffers fault, no
    extra buffer types for a model its AMX tiles would multiply)."""
    return {**os.environ, **_same_settings(models)}


def command_models(cmd: Sequence[str]) -> list[str]:
    """The model files a llama.cpp command line loads (-m, -md and their long names)."""
    flags = ("-m", "--model", "-md", "--model-draft")
    return [cmd[i + 1] for i, arg in enumerate(cmd[:-1]) if arg in flags]


def start_server(cmd: list[str], base: str, ready_seconds: float = 180.0) -> subprocess.Popen[bytes]:
    """An HTTP server (llama-server, `localspec serve`) started beside localspec as a peer is
    (peer_env), once GET base/health answers 200. Its output is not kept, so a server that
    exits first is reported with the command to run alone to see why."""
    env = peer_env(*command_models(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + ready_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"{cmd[0]} exited with status {proc.returncode} before it got ready; "
                f"run it alone to see why: {shlex.join(cmd)}"
            )
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not get ready in {ready_seconds:.0f} s; run it alone to see why: {shlex.join(cmd)}")


def bench_flags(model: str) -> list[str]:
    """The same settings for this model file as llama-bench's flags (it reads no LLAMA_ARG_
    variables)."""
    same = _same_settings([model])
    return ["--repack", same["LLAMA_ARG_REPACK"], "-fa", same["LLAMA_ARG_FLASH_ATTN"]]


def run_llama_bench(
    bin_dir: Path, model: str, tokens: int = 128, threads: int | None = None, depth: int = 0
) -> float | None:
    """llama-bench's plain decoding rate (tokens/s generating `tokens` tokens, its `tg`
    test, after `depth` tokens of context) on the same model and threads; None where the
    folder has no llama-bench."""
    program = bin_dir / LLAMA_BENCH
    if not program.exists():
        return None
    threads = threads or physical_cores()
    cmd = [str(program), "-m", model, "-p", "0", "-n", str(tokens), "-d", str(depth), "-t", str(threads), "-o", "json"]
    cmd += bench_flags(model)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    try:
        runs = json.loads(result.stdout)
        return float(next(r["avg_ts"] for r in runs if r.get("n_gen") == tokens))
    except (ValueError, StopIteration, KeyError, TypeError):
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
        raise BackendUnavailableError(f"{LLAMA_BENCH} failed (exit {result.returncode}):\n{tail}") from None
