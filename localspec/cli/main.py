"""Entry point: parses arguments, runs one subcommand, turns LocalspecError into a clear
message and exit code 2 instead of a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

from localspec.cli.signals import interrupt_on_termination
from localspec.core.errors import LocalspecError, cli_terms


def build_parser() -> argparse.ArgumentParser:
    from localspec import __version__

    parser = argparse.ArgumentParser(prog="localspec", description="Lossless speculative decoding for local LLMs.")
    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from localspec.cli import add, bench, chat, doctor, export, history, models, pull, registry, rpc_server, run, serve

    run.register(sub)
    bench.register(sub)
    doctor.register(sub)
    chat.register(sub)
    history.register(sub)
    pull.register(sub)
    models.register(sub)
    serve.register(sub)
    registry.register(sub)
    add.register(sub)
    rpc_server.register(sub)
    export.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    interrupt_on_termination()
    try:
        with cli_terms(), _passes(args):  # fixes name this command line's flags, not load()'s arguments
            code: int = args.handler(args)
        return code
    except LocalspecError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nlocalspec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0  # `localspec run ... | head` closed our stdout: not an error


# Commands whose llama.cpp passes run one at a time, each on a thread that ends with its work
# (the main thread; serve's thread a request, its models loaded on one of their own): there a
# pass runs where it is asked, as handing each to the compute thread costs two wake-ups
# (benchmarks/pages/threads.md). The chat's TUI answers from Textual's workers: handed over.
IN_PLACE = frozenset({"run", "bench", "doctor", "serve"})


def _passes(args: argparse.Namespace) -> AbstractContextManager[None]:
    if args.command not in IN_PLACE or getattr(args, "backend", "llamacpp") != "llamacpp":
        return nullcontext()
    from localspec.backends.llamacpp import compute

    in_place: AbstractContextManager[None] = compute.in_place()
    return in_place


if __name__ == "__main__":
    sys.exit(main())
