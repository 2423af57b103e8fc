"""Entry point: parses arguments, runs one subcommand, turns LocalspecError into a clear
message and exit code 2 instead of a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from localspec.cli.signals import interrupt_on_termination
from localspec.errors import LocalspecError
from localspec.rpc import RPC_HELP
from localspec.validate import ctx_arg, seed_arg, threads_arg


def _draft_tokens(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number >= 0, got {n}")
    return n


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", help="target GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft-model", help="drafter GGUF with the target's tokenizer (strategy 'draft')")
    p.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch", "mlx", "reference"])
    p.add_argument(
        "--draft-tokens",
        type=_draft_tokens,
        default="auto",
        metavar="N|auto",
        help="draft length: 'auto' adapts it to this machine and the text (default)",
    )
    p.add_argument("--ctx", type=ctx_arg, default=4096, help="context length in tokens (default 4096)")
    p.add_argument("--threads", type=threads_arg, help="CPU threads (default or 0: physical cores)")
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT...]", help=RPC_HELP)


def add_sampling_options(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--temperature", "-t", type=float, default=temperature, help=f"0 = greedy (default {temperature})")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--seed", type=seed_arg, help="sampling seed (default or -1: random)")
    p.add_argument("--max-tokens", "-n", type=int, default=512)


def build_parser() -> argparse.ArgumentParser:
    from localspec import __version__

    parser = argparse.ArgumentParser(prog="localspec", description="Lossless speculative decoding for local LLMs.")
    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from localspec.cli import add, bench, chat, doctor, export, models, pull, registry, rpc_server, run, serve

    run.register(sub)
    bench.register(sub)
    doctor.register(sub)
    chat.register(sub)
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


if __name__ == "__main__":
    sys.exit(main())
