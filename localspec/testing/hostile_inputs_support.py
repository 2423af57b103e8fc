"""Issue 47's hostile inputs as counted cases for benchmarks/fault_injection.py (each class also
has its own regression tests: tests/robustness/test_hostile_inputs.py, tests/models/test_hub_stall.py,
tests/backends/llamacpp/test_rpc_guard.py): chat templates that loop without printing, hubs that trickle a byte
at a time, and symlink loops given as models. Every case runs under a bound, so a hang counts
as a failure instead of stalling the run."""

from __future__ import annotations

import contextlib
import functools
import io
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from localspec.testing.fault_support import Tally
from localspec.testing.hostile_support import BOUND_S, bounded, environment, expect_refusal

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _hostile_template(kind: int, rng: np.random.Generator) -> str:
    """One template of a kind that never ends in reasonable time, sized at random."""
    n = int(rng.integers(2_000, 100_000))
    if kind == 0:  # nested loops over ranges, printing nothing
        depth = int(rng.integers(2, 4))
        return "".join(f"{{% for i{d} in range({n}) %}}" for d in range(depth)) + "{% endfor %}" * depth
    if kind == 1:  # a macro that calls itself twice: 2^depth calls
        depth = int(rng.integers(40, 80))
        return (
            "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
            f"{{{{ f({depth}) }}}}"
        )
    if kind == 2:  # loops over a list the template built
        return f"{{% set xs = range({n})|list %}}{{% for a in xs %}}{{% for b in xs %}}{{% endfor %}}{{% endfor %}}"
    if kind == 3:  # loops over the messages inside loops over a range: real data, endless work
        loops = f"{{% for i in range({n}) %}}{{% for j in range({n}) %}}{{% for m in messages %}}"
        return loops + "{% endfor %}" * 3
    # a recursive loop that calls itself on the same list at every item
    return "{% for x in [1, 2, 3] recursive %}{{ loop([1, 2, 3]) }}{% endfor %}"


def looping_templates(cases: int, seed: int, model: str | None = None) -> Tally:
    """Templates that loop without printing are stopped with a message naming the file, in
    process and (with a model to run) through `localspec run` on a GGUF carrying one; real
    templates still render (controls)."""
    from localspec.common.templates import CHATML, render_chat
    from localspec.core.errors import InvalidRequestError

    tally = Tally("templates: loops that print nothing")
    rng = np.random.default_rng(seed)
    for case in range(cases):
        template = _hostile_template(case % 5, rng)
        call = functools.partial(render_chat, template, CHAT, {}, source=f"case{case}.gguf")
        words = f"the chat template in case{case}.gguf" if case % 5 != 4 else "RecursionError"
        expect_refusal(tally, f"template kind {case % 5}", call, InvalidRequestError, words)
    for control in (CHATML, "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"):
        tally.tried += 1
        text, error, finished = bounded(lambda c=control: render_chat(c, CHAT, {}))  # type: ignore[misc]
        if error is not None or not finished or "hello" not in str(text):
            tally.failures.append(f"a real template failed: {error!r}")
    if model is not None:
        from localspec.testing.gguf_writer import Spec, write_gguf

        path = write_gguf(Spec("llama", chat_template=_hostile_template(0, rng)), Path(tempfile.mkdtemp()) / "t.gguf")
        _cli_refusal(tally, ["run", "-m", str(path), "hi"], f"the chat template in {path} was stopped")
    return tally


def _cli_refusal(tally: Tally, argv: list[str], words: str, cwd: Path | None = None) -> None:
    tally.tried += 1
    try:
        done = subprocess.run(
            [sys.executable, "-m", "localspec", *argv], capture_output=True, text=True, timeout=BOUND_S, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        tally.failures.append(f"localspec {' '.join(argv)}: no end within {BOUND_S:.0f} s")
        return
    if done.returncode != 2 or words not in done.stderr or "Traceback" in done.stderr:
        tally.failures.append(f"localspec {' '.join(argv)}: exit {done.returncode}: {done.stderr[-300:]}")


def trickling_hubs(cases: int, seed: int) -> Tally:
    """A hub that sends a byte every 0.1-0.4 s, from its first byte (asked about a repo) or
    inside a file, ends the pull as a silent hub does and keeps nothing partial."""
    from localspec.models.hub_errors import PullError
    from localspec.models.pull import pull
    from localspec.testing.fakehub import FakeHub, serve_test_pairs, trickling_endpoint

    tally = Tally("waits: a hub that trickles (metadata, or mid-file)")
    rng = np.random.default_rng(seed)
    for case in range(cases):
        folder = Path(tempfile.mkdtemp())
        interval = float(rng.uniform(0.1, 0.4))
        settings = {"LOCALSPEC_HOME": str(folder / "home"), "HF_HUB_CACHE": str(folder / "cache")}
        timeouts = {"HF_HUB_ETAG_TIMEOUT": "1", "HF_HUB_DOWNLOAD_TIMEOUT": "1", "HF_HUB_OFFLINE": None}
        with environment(**settings, **timeouts), FakeHub() as hub:
            serve_test_pairs(hub, folder / "home")
            if case % 2 == 0:
                with trickling_endpoint(interval) as trickling:
                    call = functools.partial(pull, "tiny", endpoint=trickling, progress=False)
                    expect_refusal(tally, f"a trickling hub, {interval:.2f} s a byte", call, PullError, "a trickle:")
                continue
            hub.trickle("tiny-drafter.gguf", interval)
            call = functools.partial(pull, "tiny", endpoint=hub.endpoint, progress=False)
            expect_refusal(tally, f"a trickled file, {interval:.2f} s a byte", call, PullError, "a trickle:")
            left = list((folder / "cache").rglob("*.incomplete"))
            if left:
                tally.failures.append(f"a trickled file left {left}")
    return tally


def symlink_loops(model: str | None = None) -> Tally:
    """Symlink loops of one to three links, with and without .gguf, and a dangling link, given
    to `add` (in process) and to `run --model` (the CLI): each named for what it is."""
    from localspec.cli.main import main

    tally = Tally("symlinks: loops and dangling links as models")
    folder = Path(tempfile.mkdtemp())
    paths = []
    for length in (1, 2, 3):
        for suffix in ("", ".gguf"):
            links = [folder / f"loop{length}-{i}{suffix}" for i in range(length)]
            for i, link in enumerate(links):
                link.symlink_to(links[(i + 1) % length])
            paths.append((links[0], "is a symlink loop"))
    dangling = folder / "gone.gguf"
    dangling.symlink_to(folder / "nowhere.gguf")
    paths.append((dangling, "no model file at"))
    for path, words in paths:
        with environment(LOCALSPEC_HOME=str(folder / "home")):
            tally.tried += 1
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code, error, finished = bounded(lambda p=path: main(["add", "mine", "--target", str(p)]))  # type: ignore[misc]
            if not finished or error is not None or code != 2 or words not in err.getvalue():
                tally.failures.append(f"add {path.name}: exit {code}, {error!r}: {err.getvalue()[-300:]}")
    if model is not None:  # `run` reaches the check only with llama-cpp-python installed
        for path, words in (paths[0], paths[1]):
            _cli_refusal(tally, ["run", "--model", f"./{path.name}", "hi"], words, cwd=folder)
    return tally


def rpc_trickles(cases: int, seed: int, folder: Path) -> Tally:
    """A client that declares a message of 1 MB to 1 GB and sends it a byte every 0.2-1 s,
    ahead of a real client on one `localspec rpc-server`: the real one is served, the
    trickler closed with a log line."""
    import struct
    import threading

    from localspec.testing.rpc_faults import START_S, answers, free_port, hello_only, start

    tally = Tally("rpc-server: a client trickling into a huge message ahead of a real one")
    rng = np.random.default_rng(seed)
    log = folder / "trickle.txt"
    port = free_port()
    proc = start(port, log)
    try:
        for case in range(cases):
            size, interval = int(rng.integers(1 << 20, 1 << 30)), float(rng.uniform(0.2, 1.0))
            tally.tried += 1
            trickler = hello_only(port)
            trickler.sendall(bytes([6]) + struct.pack("<Q", size))  # a set_tensor, declared
            stop = threading.Event()

            def drip(sock=trickler, stop=stop, interval=interval) -> None:  # type: ignore[no-untyped-def]
                with contextlib.suppress(OSError):
                    while not stop.wait(interval):
                        sock.sendall(b"\0")

            threading.Thread(target=drip, daemon=True).start()
            served = answers(port, START_S)
            stop.set()
            trickler.close()
            if not served:
                tally.failures.append(f"case {case}: {size} bytes at one per {interval:.1f} s held the server ({log})")
    finally:
        proc.terminate()
        proc.wait(START_S)
    if log.read_text().count("came at") < cases:
        tally.failures.append(f"a trickler was closed without its log line ({log})")
    return tally
