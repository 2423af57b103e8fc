"""`localspec chat`: the full-screen terminal chat."""

from __future__ import annotations

import argparse
from typing import Any

from localspec.validate import arg_text, ctx_arg, threads_arg


def register(sub: Any) -> None:
    from localspec.cli.main import add_sampling_options
    from localspec.rpc import RPC_HELP

    p = sub.add_parser(
        "chat",
        help="chat in the terminal, watching speculation work",
        description="A full-screen chat that shows speculative decoding live: which text the drafter guessed, "
        "acceptance, tokens per step and the speedup over plain decoding. Conversations are saved.",
    )
    p.add_argument(
        "model",
        nargs="?",
        help="a pair from models.toml (offered for pulling if not pulled), a GGUF file, "
        "or nothing for the embedded SmolLM2-135M-Instruct",
    )
    p.add_argument("--draft-model", help="drafter GGUF with the target's tokenizer (strategy 'draft')")
    p.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch", "mlx", "reference"])
    p.add_argument("--strategy", "-s", default="auto", help="auto (default), none, ngram or draft")
    p.add_argument(
        "--draft-tokens",
        type=_draft_tokens,
        default="auto",
        metavar="N|auto",
        help="draft length: 'auto' adapts it to this machine and the text (default)",
    )
    p.add_argument("--system", type=arg_text, default="", help="system message")
    p.add_argument("--ctx", type=ctx_arg, default=4096, help="context length in tokens (default 4096)")
    p.add_argument("--threads", type=threads_arg, help="CPU threads (default or 0: physical cores)")
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT...]", help=RPC_HELP)
    p.add_argument("--history-path", action="store_true", help="print where conversations are saved, then exit")
    add_sampling_options(p, temperature=0.8)
    p.set_defaults(handler=handle, max_tokens=1024)


def _draft_tokens(value: str) -> int | str:
    from localspec.cli.main import _draft_tokens as parse

    return parse(value)


def handle(args: argparse.Namespace) -> int:
    from localspec.history import history_file

    if args.history_path:
        print(history_file())
        return 0
    from localspec.tui import ChatApp, ChatSettings
    from localspec.tui.models import load_runtime, missing_model

    settings = ChatSettings(
        model=args.model,
        draft_model=args.draft_model,
        backend=args.backend,
        strategy=args.strategy,
        draft_tokens=args.draft_tokens,
        n_ctx=args.ctx,
        threads=args.threads,
        rpc=args.rpc,
        system=args.system,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
    )
    ChatApp(load_runtime, settings, missing_model=missing_model).run()
    return 0
